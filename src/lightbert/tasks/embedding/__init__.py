"""Sentence embeddings: pairs and triplets, contrastive fine-tuning, retrieval scores (`task=embedding`)."""

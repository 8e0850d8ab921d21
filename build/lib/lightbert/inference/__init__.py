"""Inference: fine-tuned models, predictions, contextual embeddings."""

"""Data: tokenizer, corpora, pre-training examples, masking and DataModules."""

"""lightbert: pre-train and fine-tune BERT with Lightning and Hydra."""

__version__ = "0.1.0"

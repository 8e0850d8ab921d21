"""The base every fine-tuning family builds on: its DataModule, its LightningModule, and the predictions protocol."""

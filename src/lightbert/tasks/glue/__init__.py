"""GLUE: its data, its LightningModule (sequence classification) and its metrics and submission files."""

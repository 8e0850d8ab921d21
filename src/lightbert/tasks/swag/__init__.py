"""SWAG: its data and its LightningModule (multiple choice)."""

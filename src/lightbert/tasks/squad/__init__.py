"""SQuAD v1.1/v2.0: its data, its LightningModule (question answering), the answers' post-processing and the official
scorer."""

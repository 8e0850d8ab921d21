"""CoNLL-2003 NER: its data, its LightningModule (token classification) and entity-level F1."""

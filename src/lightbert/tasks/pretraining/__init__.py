"""Pre-training: corpus, sentences, examples, masking, streaming, the DataModule, the LightningModule and the paper's
objectives."""

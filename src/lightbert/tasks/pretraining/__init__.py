"""Pre-training: corpus, sentences, examples, masking, the examples' cache and stream, the resume position, the
DataModule, the LightningModule and the paper's objectives."""

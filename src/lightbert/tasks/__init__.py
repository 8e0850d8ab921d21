"""LightningModules, one per objective family, each wrapping the shared encoder."""

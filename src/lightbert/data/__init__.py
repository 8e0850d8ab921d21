"""Plumbing every task shares: the WordPiece tokenizer, BERT's input format (encoding), batching and padding, and
task data from local files or the hub. Pre-training's corpus, examples and masking live in
`lightbert.tasks.pretraining`."""

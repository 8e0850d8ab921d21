"""lightbert: pre-train and fine-tune BERT with Lightning and Hydra."""

__version__ = "0.1.0"

# What a finished run leaves in its directory: written by lightbert.train, read by interop (init_from=<run dir>)
# and by the sweep summary.
RESULTS_FILE = "results.json"

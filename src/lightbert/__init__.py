"""lightbert: pre-train and fine-tune BERT with Lightning and Hydra.

The public verbs, for notebooks and scripts (the commands run the same functions):

    import lightbert
    cfg = lightbert.compose_config(["task=glue/sst2", "init_from=..."], "outputs/my-run")
    results = lightbert.train(cfg)                   # or lightbert.evaluate(cfg)
    model = lightbert.load_finetuned("outputs/my-run")
    predicted, _ = lightbert.predict_records(model, [("a", {"sentence": "a fine film"})])
    pretrained = lightbert.load_pretrained("bert-base-uncased")   # a run, a .ckpt, a Hugging Face dir or hub id

They load on first use, so that `import lightbert` (and every command's --help) stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Each public name and the module that defines it.
_PUBLIC = {
    "compose_config": "lightbert.run.configs",
    "train": "lightbert.run.train",
    "evaluate": "lightbert.run.evaluate",
    "load_finetuned": "lightbert.tasks.finetuned",
    "predict_records": "lightbert.inference.predict",
    "load_pretrained": "lightbert.checkpoints.reading",
}
__all__ = [*_PUBLIC, "__version__"]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'lightbert' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)

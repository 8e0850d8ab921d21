"""Checkpoint files: reading any a run starts from (`reading`: a lightbert .ckpt or run directory, a Hugging Face
directory, a hub id) and Hugging Face's parameter names both ways (`hf_format`). Writing them during training is the
Trainer's (`lightbert.plugins.checkpointing`); building a fine-tuned head from one is `lightbert.tasks.finetuned`'s."""

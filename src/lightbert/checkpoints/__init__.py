"""Checkpoints, in one place: reading any a run starts from (`reading`: a lightbert .ckpt or run directory, a Hugging
Face directory, a hub id) and a fine-tuned model's head and settings (`finetuned`); writing them atomically during
training and resuming from them exactly (`saving`). Converting to and from other formats is `lightbert.interop`'s."""

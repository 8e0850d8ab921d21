"""The tasks: the base of every LightningModule (`task_module`), the head registry (`heads`), a fine-tuned model read
back with its head (`finetuned`), pre-training, the fine-tuning base, and one folder per task family (glue, squad,
ner, swag), each registering its head in its own `head.py`."""

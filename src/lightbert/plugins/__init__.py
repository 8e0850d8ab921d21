"""What the Lightning Trainer is handed: callbacks (progress, throughput, MFU, the resume agreement), checkpointing
(atomic writes, the latest checkpoint, RNG state, the agreed stop on a signal), loggers and the FSDP2 strategy."""

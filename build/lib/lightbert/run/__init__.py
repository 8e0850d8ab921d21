"""Running a job: train/evaluate orchestration, the run directory, checkpoints, callbacks, loggers, console, config
checks, strategies, the command line."""

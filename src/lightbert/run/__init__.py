"""A job: its typed settings, built once (`settings`, `phases`), the run directory held and the resume decided
(`run_dir`), the checks on this machine and the record (`preflight`), the model's sizes and init_from's weights
(`weights`), the speed switches, the console, and the train and evaluate flows (`jobs`)."""

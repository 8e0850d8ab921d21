"""A run: `train(cfg)` (`train.py`) and `evaluate(cfg)` (`evaluate.py`), each one function from the config to the
results, and the rooms they pass through in order: the typed settings, built once (`config_checks`, `settings`,
`phases`), the run directory held and the resume decided (`run_dir`), the console (`console`), the checks on this
machine (`machine_checks`), the model (`model_choice`), the record (`record`), the run line (`run_line`), the objects
built from the config (`building`, with the speed switches of `speed`), and the outputs (`outputs`)."""

"""The config tree lightbert ships (conf/, reached as lightbert/conf): where it is, its groups' options, the run
directory's default name (a resolver the configs use), and a config composed as a command would compose it."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

# conf/ at the repository's top level; the package reaches it as lightbert/conf (a link in a checkout, a copy in the
# wheel), so an installed lightbert runs from any directory.
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def run_name() -> str:
    """The default run directory's name (conf/hydra/default.yaml): the time, or in a SLURM job the job's id, so that
    a job SLURM requeues finds its run again (`run_dir.requeued`)."""
    from datetime import datetime

    from lightbert.cluster.environment import cluster_environment

    job = os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID")
    if job and cluster_environment() == "slurm":
        task = os.environ.get("SLURM_ARRAY_TASK_ID")
        return f"slurm-{job}" + (f"_{task}" if os.environ.get("SLURM_ARRAY_JOB_ID") and task else "")
    return datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


if not OmegaConf.has_resolver("lightbert_run_name"):
    OmegaConf.register_new_resolver("lightbert_run_name", run_name, use_cache=True)


def is_group(key: str, conf_dir: Path) -> bool:
    return (conf_dir / key.replace(".", "/")).is_dir()


def group_options(group: str, conf_dir: Path = CONF_DIR) -> list[str]:
    """The options of a config group, nested ones as `glue/mrpc`; files starting with `_` are shared parts."""
    root = conf_dir / group.replace(".", "/")
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml") if not p.name.startswith("_"))


def compose_config(
    overrides: list[str], output_dir: str | Path, conf_dir: Path = CONF_DIR, config_name: str = "train"
) -> DictConfig:
    """The config `python src/train.py OVERRIDES` would run (`config_name="evaluate"`: src/evaluate.py's), with its
    run directory at `output_dir`.

    For notebooks and tests: `train(compose_config([...], dir))` is a run without the command line.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(output_dir)
        cfg.paths.output_dir = str(output_dir)
    HydraConfig.instance().set_config(cfg)  # so ${hydra:...} interpolations resolve outside a Hydra run
    with open_dict(cfg):
        del cfg["hydra"]  # as in a real run: the task function never sees Hydra's own node
    return cfg

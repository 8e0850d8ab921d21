"""The record a run writes into its run directory before it trains (`run.run_dir` holds the directory): `.hydra/`
(the config as recorded, the overrides, Hydra's config, the data's sources as `machine_checks.data_sources` found
them, the SLURM job), checked against what a resumed run continues; and the temporary files a killed save left,
removed. The config as recorded is also what the loggers get: it names the model that runs (`recorded_config`: the
run's name and W&B tags too). What a finished run writes is `run.outputs`'s."""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from lightbert.cluster.environment import is_global_zero
from lightbert.errors import UserError
from lightbert.files import write_atomically
from lightbert.model_config import BertConfig
from lightbert.run.run_dir import DATA_RECORD, RECORD_DIR, SLURM_RECORD
from lightbert.run.settings import RunSettings

log = logging.getLogger(__name__)


# What a resumed run may set differently from the run it continues: where metrics go, what observes the run
# (callbacks) and how progress is shown; and where the run directory is (`paths.output_dir`: a run directory moved or
# copied resumes where it now is). Everything else (data, model, optimiser, length) continues as recorded.
# speed.compile changes how the step runs, not its numbers: a resumed run may compile or not (a run recorded
# before its null default recorded false).
CHANGEABLE_ON_RESUME = (
    "resume",
    "logger",
    "callbacks",
    "trainer.enable_progress_bar",
    "trainer.log_every_n_steps",
    "paths.output_dir",
    "speed.compile",
)


def recorded_config(settings: RunSettings, model: BertConfig, name: str | None) -> DictConfig:
    """The config as recorded and given to the loggers. Under init_from the checkpoint decides the model (`name`: its
    conf/model/ size, e.g. bert_tiny), and the record, the run's name and its W&B tags say the model that runs, not
    the `model=` default (a fine-tune of a bert_tiny checkpoint is not "sst2-bert_mini"); without (`name` None) the
    config as composed. The settings stay as they were built."""
    if name is None:
        return settings.config
    config = copy.copy(settings.config)  # the record's copy (DictConfig.copy); the settings stay as they were
    default_name = f"{settings.task.name}-{settings.model_option}"
    with open_dict(config):
        config.model = {k: v for k, v in model.to_dict().items() if k != "vocab_size"}
        if config.get("run_name") == default_name:
            config.run_name = f"{settings.task.name}-{name}"
        wandb = (config.get("logger") or {}).get("wandb")
        if wandb is not None and settings.model_option in (wandb.get("tags") or []):
            wandb.tags = [name if tag == settings.model_option else tag for tag in wandb.tags]
    return config


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out or {prefix.rstrip("."): {}}
    return {prefix.rstrip("."): node}


def _override(key: str, value: Any) -> str:
    """`key=value` as the command line writes it: null, true/false, [a,b]."""
    if value is None:
        return f"{key}=null"
    if isinstance(value, bool):
        return f"{key}={str(value).lower()}"
    if isinstance(value, list):
        return f"{key}=[{','.join(str(v) for v in value)}]"
    return f"{key}={value}"


def _override_key(override: str) -> str:
    """The key of a command-line override: `speed.fp8` for `speed.fp8=true`, `+callbacks.x=...`, `~logger`."""
    return override.split("=", 1)[0].lstrip("+~")


# What a resume may change when the checkpoint says the global batch stays the same
# (`machine_checks.check_job_shape`): the devices and nodes a requeued job gets, and the accumulation that keeps the
# global batch.
RESIZABLE_ON_RESUME = ("trainer.devices", "trainer.num_nodes", "trainer.accumulate_grad_batches")


def _under(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith(prefix + ".")


def _changed_choices(record: Path) -> list[tuple[str, Any, Any]]:
    """(group, recorded option, option now) for each config group whose option this command changes, from the
    record's `hydra.yaml` and this run's Hydra config; none where either is missing (a run started by `train(cfg)`)."""
    hydra_record = record / "hydra.yaml"
    if not hydra_record.is_file() or not HydraConfig.initialized():
        return []
    before = OmegaConf.to_container(OmegaConf.load(hydra_record).hydra.runtime.choices)
    after = OmegaConf.to_container(HydraConfig.get().runtime.choices)
    return [
        (group, before.get(group), after.get(group))
        for group in sorted(set(before) | set(after))
        if before.get(group) != after.get(group)
        and not group.startswith("hydra")
        and not any(_under(group, c) for c in CHANGEABLE_ON_RESUME)
    ]


def record_run(
    config: DictConfig,
    overrides: tuple[str, ...],
    output_dir: Path,
    resuming: bool,
    resized: bool = False,
    sources: dict[str, Any] | None = None,
) -> None:
    """The run's record in `.hydra/`: the config (as composed, interpolations kept), the command line's overrides
    and, in a Hydra run, Hydra's own config; and what its data is read from (`sources`: `.hydra/data.json`). A
    resumed run continues the run as recorded: a setting it changes is refused with the keys named (only
    `CHANGEABLE_ON_RESUME` may change), so is other data, and the record is left as it was. The checks come first: a
    refused command writes nothing. Then the temporary files a killed save left are removed."""
    record = output_dir / RECORD_DIR
    config = OmegaConf.to_container(config, resolve=False)
    settings_recorded = resuming and (record / "config.yaml").is_file()
    data_record = output_dir / DATA_RECORD
    if settings_recorded:
        recorded = _flat(OmegaConf.to_container(OmegaConf.load(record / "config.yaml"), resolve=False))
        now = _flat(config)
        # A setting that an earlier lightbert did not have (e.g. speed.fp8) is not in that run's record: at its
        # default, it changes nothing, so the run resumes; set on this command line, it is a change like any other.
        overridden = {_override_key(o) for o in overrides}
        changed = [
            key
            for key in sorted(set(recorded) | set(now))
            if recorded.get(key) != now.get(key)
            and not any(_under(key, c) for c in CHANGEABLE_ON_RESUME)
            and not (resized and key in RESIZABLE_ON_RESUME)
            and (key in recorded or any(_under(key, o) for o in overridden))
        ]
        if changed:
            # A group's option changed (trainer=ddp for trainer=fsdp) is named as the command line says it, not as
            # the keys under it that differ.
            groups = [c for c in _changed_choices(record) if any(_under(key, c[0].split("/")[0]) for key in changed)]
            keys = [key for key in changed if not any(_under(key, group.split("/")[0]) for group, _, _ in groups)]
            shown = [f"{g}={before} recorded, {g}={after} now" for g, before, after in groups]
            shown += [f"{k}: {recorded.get(k)!r} recorded, {now.get(k)!r} now" for k in keys]
            # A default that changed since the run started (a newer lightbert) is no override to drop: set it back
            as_recorded = [f"{g}={before}" for g, before, _ in groups if before is not None]
            as_recorded += [_override(k, recorded[k]) for k in keys if k in recorded]
            set_back = f", or set them back as recorded ({' '.join(as_recorded[:6])})" if as_recorded else ""
            raise UserError(
                f"resume=true continues the run in {output_dir} as recorded in {record / 'config.yaml'}, and this "
                f"command changes {len(shown)} setting(s): {'; '.join(shown[:6])}. To resume, drop the overrides "
                f"that change them{set_back}; or start a new run in another directory (e.g. with init_from=<this "
                "run> to fine-tune from it)"
            )
    # A resumed run must read the data it started with, or it would continue on other examples and another
    # validation set without a word (a run recorded before lightbert kept data.json is not checked).
    if resuming and sources is not None and data_record.is_file():
        recorded = json.loads(data_record.read_text())
        changed = [name for name in sorted(set(recorded) | set(sources)) if recorded.get(name) != sources.get(name)]
        if changed:
            raise UserError(
                f"resume=true continues the run in {output_dir} on the data it started with, and {len(changed)} of "
                f"its sources changed since ({', '.join(changed[:3])}: another size, time or file). Restore them, or "
                "start a new run in another directory (init_from=<this run> starts from its weights)"
            )
    remove_stale_temporaries(output_dir)
    if not is_global_zero():
        return
    if not settings_recorded:
        record_slurm_job(output_dir)
        write_atomically(record / "config.yaml", OmegaConf.to_yaml(config))
        write_atomically(record / "overrides.yaml", OmegaConf.to_yaml(list(overrides)))
        if HydraConfig.initialized():
            write_atomically(record / "hydra.yaml", OmegaConf.to_yaml({"hydra": HydraConfig.get()}))
    if not resuming and sources is not None:
        write_atomically(data_record, json.dumps(sources, indent=2) + "\n")


def record_slurm_job(output_dir: Path) -> None:
    """The SLURM job a new run was started by, which `requeued` recognises when SLURM starts the job again."""
    if os.environ.get("SLURM_JOB_ID") and is_global_zero():
        write_atomically(output_dir / SLURM_RECORD, json.dumps({"job_id": os.environ["SLURM_JOB_ID"]}) + "\n")


def remove_stale_temporaries(output_dir: Path) -> None:
    """Temporary files a killed save left (`.last.ckpt.tmp-<host>-<pid>`, up to a checkpoint's size): with the run
    directory locked, no process is writing them any more. Never a finished file."""
    stale = [p for d in (output_dir, output_dir / "checkpoints") if d.is_dir() for p in d.glob(".*.tmp-*")]
    if stale and is_global_zero():
        size = sum(p.stat().st_size for p in stale if p.is_file())
        for path in stale:
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        log.warning(
            f"removed {len(stale)} temporary file(s) ({size / 2**20:.1f} MB) that a killed save left in {output_dir}"
        )

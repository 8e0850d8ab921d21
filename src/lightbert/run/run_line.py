"""The run line: the one console line that says what a run trains, on what data, where, how long, and in which
batches (`train` and `evaluate` say it once the run's record is written)."""

from __future__ import annotations

from lightbert.model_config import BertConfig
from lightbert.run.run_dir import Start
from lightbert.run.settings import RunSettings
from lightbert.run.speed_settings import MATMUL_PRECISIONS


def describe_run(
    settings: RunSettings,
    model: BertConfig,
    evaluation: bool = False,
    left_to_right: str | None = None,
    start: Start | None = None,
) -> str:
    """The run line: what is trained on what data, where, how long, in which batches. `left_to_right` says why the
    model attends left to right (`weights.left_to_right_because`), where it does."""
    sizes = f"L{model.num_hidden_layers}/H{model.hidden_size}/A{model.num_attention_heads}"
    if left_to_right:
        sizes += f", attention left to right ({left_to_right})"
    source = f"init_from={settings.init_from}" if settings.init_from else "from scratch"
    if start is not None and start.resuming:
        source = f"resumed from step {start.step} of {start.resume_from}"
    task, trainer, batches = settings.task, settings.trainer, settings.batches
    if not task.fine_tuning:
        data = f"corpus {settings.corpus_label}"
    else:
        data = ", ".join(f"{k}={v}" for k, v in (task.data_files or {}).items()) or "the hub's data"
    devices = f"{batches.devices} x {trainer.accelerator}" + (f" x {batches.nodes} nodes" if batches.nodes > 1 else "")
    steps = trainer.max_steps if trainer.max_steps > 0 else None
    epochs = trainer.max_epochs if trainer.max_epochs is not None and trainer.max_epochs >= 0 else None
    # Lightning stops at whichever limit comes first; a fine-tune on trainer=cpu has both (3 epochs, 200 steps).
    length = " or ".join([f"{epochs} epochs"] * (epochs is not None) + [f"{steps} steps"] * (steps is not None))
    if evaluation:  # src/evaluate.py trains nothing
        length = "evaluation only"
    # fp32's matmuls on a CUDA GPU (`speed.set_fp32_matmuls`); None where no CUDA device runs the job.
    matmuls = MATMUL_PRECISIONS[settings.speed.matmul_precision] if trainer.on_cuda else None
    precision = trainer.precision + (f" ({matmuls})" if matmuls else "")
    if trainer.precision in ("bf16-true", "16-true") and not evaluation:
        precision += " (fp32 master weights)"  # lightbert.optim.MasterWeights
    if settings.speed.fp8 and not evaluation:
        precision += ", fp8 matmuls" + (" (emulated on CPU: slower than fp32)" if matmuls is None else "")
    accumulated = f" x {batches.accumulate} accumulated" if batches.accumulate > 1 else ""
    strategy = "fsdp (FSDP2, fully_shard)" if trainer.strategy == "fsdp" else trainer.strategy
    return (
        f"{task.name}: {sizes} ({source}) on {data}; {devices}, strategy {strategy}, {precision}, {length}, "
        f"batch {batches.per_device} per device{accumulated} = {batches.global_batch} per step"
    )


def describe_phases(settings: RunSettings) -> list[str]:
    """The line each phase of a recipe starts with: its steps and what it changes, and where it trains its own batch,
    how many sequences a step that makes (task.global_batch_size is the first phase's: a phase's batch_size scales
    the global batch with it, the accumulation and the devices staying the run's)."""
    lines, batches, phases = [], settings.batches, settings.phases
    devices, wanted = batches.devices * batches.nodes, settings.task.global_batch_size
    for number, phase in enumerate(phases, start=1):
        line = f"phase {number}/{len(phases)}: steps {phase.first_step}-{phase.end_step}, {phase.datamodule}"
        per_device = phase.datamodule.get("batch_size")
        if per_device is not None and per_device != batches.per_device:
            line += (
                f"; {per_device * devices * batches.accumulate} sequences a step ({per_device} per device x "
                f"{devices} device(s) x {batches.accumulate} accumulated)"
            )
            line += f", where task.global_batch_size={wanted} sets the first phase's" if wanted else ""
        lines.append(line)
    return lines

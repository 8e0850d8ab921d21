"""Recipes that change the data during a run (`task.phases`): the paper's 90% of the steps at 128 tokens, then 512."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from lightbert.errors import ConfigError


@dataclass(frozen=True)
class Phase:
    first_step: int
    end_step: int
    datamodule: dict  # task.datamodule keys this phase changes, e.g. max_seq_length

    @property
    def max_seq_length(self) -> int | None:
        return self.datamodule.get("max_seq_length")


def phases_of(node: DictConfig | None, max_steps: int) -> list[Phase]:
    """task.phases (`node`) as step ranges of trainer.max_steps; one phase (no changes) without them."""
    listed = OmegaConf.to_container(node, resolve=True) if node else []
    if not listed:
        return [Phase(0, max_steps, {})]
    total, out, first = max_steps, [], 0
    if total <= 0:
        raise ConfigError("task.phases need trainer.max_steps (the whole run's steps), e.g. trainer.max_steps=1000000")
    for number, phase in enumerate(listed, start=1):
        if set(phase) != {"until", "datamodule"} or not 0 < phase["until"] <= 1:
            raise ConfigError(
                f"task.phases[{number - 1}] must have `until` (a fraction of trainer.max_steps in (0, 1]) and "
                f"`datamodule` (the task.datamodule keys it changes), got {phase}"
            )
        end = round(phase["until"] * total)
        if end <= first:
            raise ConfigError(f"task.phases[{number - 1}] ends at step {end}, not after the previous one ({first})")
        out.append(Phase(first, end, dict(phase["datamodule"])))
        first = end
    if first != total:
        raise ConfigError(f"the last of task.phases must run until 1.0 (trainer.max_steps), not step {first}")
    return out

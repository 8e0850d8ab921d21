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
    if node is not None and not OmegaConf.is_list(node):
        raise ConfigError(
            f"task.phases must be a list of phases, each `until` (a fraction of trainer.max_steps) and `datamodule` "
            f"(the task.datamodule keys it changes), or null for one phase; got {node!r}"
        )
    listed = OmegaConf.to_container(node, resolve=True) if node else []
    if not listed:
        return [Phase(0, max_steps, {})]
    total, out, first = max_steps, [], 0
    if total <= 0:
        raise ConfigError("task.phases need trainer.max_steps (the whole run's steps), e.g. trainer.max_steps=1000000")
    for number, phase in enumerate(listed, start=1):
        until = phase.get("until") if isinstance(phase, dict) else None
        fraction = isinstance(until, int | float) and not isinstance(until, bool) and 0 < until <= 1
        if not isinstance(phase, dict) or set(phase) != {"until", "datamodule"} or not fraction:
            raise ConfigError(
                f"task.phases[{number - 1}] must have `until` (a fraction of trainer.max_steps in (0, 1]) and "
                f"`datamodule` (the task.datamodule keys it changes), got {phase}"
            )
        end = round(until * total)
        if end <= first:
            # Too few steps for the recipe's phases (the user may never have written task.phases): say how many.
            enough = next(
                n for n in range(total + 1, 10 * total + len(listed) + 2) if _each_phase_has_a_step(listed, n)
            )
            raise ConfigError(
                f"trainer.max_steps={total} is too few for task.phases: phase {number} (until {until}) would end at "
                f"step {end}, where the one before it ended; set trainer.max_steps={enough} or more"
            )
        out.append(Phase(first, end, dict(phase["datamodule"])))
        first = end
    if first != total:
        raise ConfigError(f"the last of task.phases must run until 1.0 (trainer.max_steps), not step {first}")
    return out


def _each_phase_has_a_step(listed: list[dict], total: int) -> bool:
    ends = [round(phase["until"] * total) for phase in listed]
    return all(end > before for before, end in zip([0, *ends], ends, strict=False))

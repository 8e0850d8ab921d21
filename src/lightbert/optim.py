"""Optimisers and learning-rate schedules shared by every task.

- `optim=adamw`: AdamW as in the paper's Appendix A.2 (beta1 0.9, beta2 0.999, weight decay 0.01), with no decay
  on biases and LayerNorm weights (the reference's `exclude_from_weight_decay`), linear warmup then linear decay
  to 0.
- `optim=lamb`: LAMB (You et al. 2019, Algorithm 2), the large-batch optimiser of NVIDIA's BERT recipe: Adam's
  bias-corrected step plus weight decay, scaled per tensor by the trust ratio ||w|| / ||step||. As in the
  reference LAMB and NVIDIA's (`use_nvlamb=False`), biases and LayerNorm weights get neither weight decay nor the
  trust ratio. Its schedule is NVIDIA's `PolyWarmUpScheduler`: linear warmup, then (1 - step/total)^power.
- `optim.decay_ratio`: warmup-stable-decay instead (the modern recipe's, task=pretrain_modern): the peak rate held
  after warmup, then a 1-sqrt decay to 0 over that last share of the steps.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    import lightning as L

from lightbert.optim_config import OptimConfig


def parameter_groups(model: nn.Module, weight_decay: float, row_blocks: bool = False) -> list[dict]:
    """Two groups: matrices decay (and LAMB adapts them); biases and LayerNorm weights (every 1-d parameter) not.

    With `row_blocks` (LAMB), the weights of fused projections (a module's `row_blocks`: BERT's query, key and value
    in one `qkv`) make a third group, whose `blocks` says into how many blocks of rows each splits: LAMB's trust
    ratio is per block there, as it is per tensor for transformers' three separate weights."""
    fused = {}
    if row_blocks:
        for module in model.modules():
            for name, count in getattr(module, "row_blocks", {}).items():
                fused[id(module.get_parameter(name))] = count
    decay, no_decay, blocked = [], [], {}
    for parameter in model.parameters():  # tied weights appear once
        if not parameter.requires_grad:
            continue
        if parameter.ndim < 2:
            no_decay.append(parameter)
        elif id(parameter) in fused:
            blocked.setdefault(fused[id(parameter)], []).append(parameter)
        else:
            decay.append(parameter)
    groups = [
        {"params": decay, "weight_decay": weight_decay, "adapt": True},
        {"params": no_decay, "weight_decay": 0.0, "adapt": False},
    ]
    if row_blocks:
        groups = [{**group, "blocks": 1} for group in groups]
        groups += [
            {"params": ps, "weight_decay": weight_decay, "adapt": True, "blocks": n} for n, ps in blocked.items()
        ]
    return groups


class Lamb(torch.optim.Optimizer):
    """LAMB, Algorithm 2 of You et al. (2019), with phi the identity, for every parameter of a group with
    `adapt=True`; the others take the plain bias-corrected Adam step (trust ratio 1). A group's `blocks` (default 1)
    splits each of its weights into that many blocks of rows, each with its own trust ratio (a fused projection's
    parts, `parameter_groups`)."""

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.01):
        super().__init__(
            params,
            {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "adapt": True, "blocks": 1},
        )

    @torch.no_grad()
    def step(self, closure=None):
        loss = _closure_loss(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)  # m_t
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)  # v_t
                # r_t = m_hat / (sqrt(v_hat) + eps), with the bias corrections 1 - beta^t
                update = (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt_().add_(group["eps"]))
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])  # r_t + lambda x_t
                if group["adapt"]:  # one trust ratio per block of rows: (blocks, ...)
                    weights, update = p.unflatten(0, (group["blocks"], -1)), update.unflatten(0, (group["blocks"], -1))
                    weight_norm, update_norm = weights.flatten(1).norm(dim=1), update.flatten(1).norm(dim=1)
                    trust = torch.where((weight_norm > 0) & (update_norm > 0), weight_norm / update_norm, 1.0)
                    update = (update * trust.view(-1, *[1] * (update.ndim - 1))).flatten(0, 1)
                p.sub_(update, alpha=group["lr"])
        return loss


def _closure_loss(closure):
    """The loss of an optimiser's `closure` (forward and backward, as Lightning passes it), or None."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def linear_warmup_decay(warmup_steps: int, total_steps: int):
    """LR multiplier: 0 -> 1 over the warmup, then linearly down to 0 at `total_steps`.

    The same numbers as the reference's warmup + polynomial decay (power 1) and transformers'
    `get_linear_schedule_with_warmup`: the first step has lr 0 when there is a warmup.
    """

    def factor(step: int) -> float:
        if step < warmup_steps:
            return step / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return factor


def poly_warmup_decay(warmup_steps: int, total_steps: int, power: float):
    """LR multiplier of NVIDIA's `PolyWarmUpScheduler`: step/warmup, then (1 - step/total)^power."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return step / warmup_steps
        return max(0.0, 1.0 - step / total_steps) ** power

    return factor


def warmup_stable_decay(warmup_steps: int, total_steps: int, decay_steps: int):
    """LR multiplier of a warmup-stable-decay (trapezoidal) schedule: step/warmup, then 1 until the last
    `decay_steps`, then 1 - sqrt(progress through them) down to 0 (the 1-sqrt cooldown of Hägele et al. 2024, which
    ModernBERT uses)."""
    decay_start = max(warmup_steps, total_steps - decay_steps)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return step / warmup_steps
        if step < decay_start:
            return 1.0
        return max(0.0, 1.0 - math.sqrt((step - decay_start) / max(1, total_steps - decay_start)))

    return factor


def clip_gradients(trainer: L.Trainer, optimizer: torch.optim.Optimizer, max_value: float | None, algorithm) -> None:
    """Clips the true gradients (global L2 norm, or each value) before `optimizer` steps, for every precision and
    strategy the trainer configs use.

    - fp32 and bf16-mixed: the gradients are already true values (bf16 autocast keeps fp32 weights and grads).
    - 16-mixed: the gradients are scaled. Lightning unscales them before clipping, except for an optimizer that
      unscales inside its step (the fused AdamW); for that one they are unscaled here, and `GradScaler.step` then
      knows not to unscale again (it still skips the step on inf/NaN).
    - bf16-true (a bf16 model, `MasterWeights`): bf16 gradients, whose global norm is summed in fp32 here.
    - FSDP (trainer=fsdp): each device holds a shard of every weight and its gradient (DTensors); the global norm is
      reduced across the devices before any gradient is scaled (`_clip_sharded`), never a shard's own norm.
    """
    if not max_value:
        return
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    if scaler is not None and getattr(optimizer, "_step_supports_amp_scaling", False):
        scaler.unscale_(optimizer)
    from torch.distributed.tensor import DTensor

    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    if algorithm == "value":  # Lightning's GradClipAlgorithmType is a str enum
        torch.nn.utils.clip_grad_value_(parameters, max_value)
    elif any(isinstance(p, DTensor) for p in parameters):
        _clip_sharded(parameters, max_value)
    elif isinstance(optimizer, MasterWeights):
        _clip_half_gradients(parameters, max_value)
    else:
        torch.nn.utils.clip_grad_norm_(parameters, max_value)


def _clip_sharded(parameters: list[torch.Tensor], max_norm: float) -> None:
    """Clips sharded gradients (DTensors) by their global L2 norm: each shard's norm is a partial result, and
    `full_tensor()` reduces them across the devices (one all-reduce), so every device scales by the same factor."""
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)


class MasterWeights(torch.optim.Optimizer):
    """The optimiser of a model held in bf16 (`trainer.precision=bf16-true`): the update is computed on fp32 copies
    of the weights (the master weights), and the model's bf16 weights are rounded from them once per step.

    The model then runs bf16 from end to end with no cast per use (autocast casts every weight and activation at
    every matmul), and no update is lost: an AdamW step of lr 1e-4 is below bf16's resolution for most weights (8
    bits of mantissa), so a bf16 model stepped by a bf16 optimiser stops learning. Its `param_groups` are the
    model's (what Lightning clips and the schedule sets the learning rate of); `inner` steps the masters with the
    same hyperparameters. Checkpoints hold the fp32 masters as the weights (`TaskModule.on_save_checkpoint`) and in
    the optimiser's state, so a resume continues exactly and init_from loads the fp32 weights.
    """

    def __init__(self, groups: list[dict], make_inner, fp32_weights: dict[int, torch.Tensor] | None = None):
        """`fp32_weights`: the fp32 values of some weights (by the weight's id()) from before the model was cast,
        which their masters start from; the others start from the weights as they are."""
        weights = [list(group["params"]) for group in groups]
        self.masters = [[_master(p, (fp32_weights or {}).get(id(p))) for p in group] for group in weights]
        self.inner = make_inner(
            [{**_hyperparameters(g), "params": m} for g, m in zip(groups, self.masters, strict=True)]
        )
        # The inner optimiser's groups, with its defaults filled in, over the model's weights.
        super().__init__(
            [{**_hyperparameters(g), "params": w} for g, w in zip(self.inner.param_groups, weights, strict=True)], {}
        )

    def master_of(self) -> dict[int, torch.Tensor]:
        """Each model weight's master, by the weight's id()."""
        return {
            id(p): m
            for group, ms in zip(self.param_groups, self.masters, strict=True)
            for p, m in zip(group["params"], ms, strict=True)
        }

    @torch.no_grad()
    def step(self, closure=None):
        loss = _closure_loss(closure)
        for group, inner_group, masters in zip(self.param_groups, self.inner.param_groups, self.masters, strict=True):
            inner_group.update(_hyperparameters(group))  # the schedule's learning rate
            for p, master in zip(group["params"], masters, strict=True):
                master.grad = None if p.grad is None else p.grad.float()
        self.inner.step()
        for group, masters in zip(self.param_groups, self.masters, strict=True):
            for p, master in zip(group["params"], masters, strict=True):
                master.grad = None  # fp32 gradients live only during the step
                p.copy_(master)  # rounded to the model's dtype
        return loss

    def state_dict(self) -> dict:
        return {
            "inner": self.inner.state_dict(),
            "masters": [list(masters) for masters in self.masters],
            "param_groups": [_hyperparameters(group) for group in self.param_groups],
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self.inner.load_state_dict(state_dict["inner"])
        for group, saved in zip(self.param_groups, state_dict["param_groups"], strict=True):
            group.update(saved)
        with torch.no_grad():
            for masters, saved in zip(self.masters, state_dict["masters"], strict=True):
                for master, value in zip(masters, saved, strict=True):
                    master.copy_(value)


def _master(weight: torch.Tensor, fp32: torch.Tensor | None) -> torch.Tensor:
    if fp32 is None or fp32.shape != weight.shape:
        return weight.detach().float().clone()
    return fp32.to(weight.device, torch.float32, copy=True)


def _hyperparameters(group: dict) -> dict:
    return {key: value for key, value in group.items() if key != "params"}


def _clip_half_gradients(parameters: list[torch.Tensor], max_norm: float) -> None:
    """Global-norm clipping of a bf16 model's gradients with the norm summed in fp32 (torch's clip_grad_norm_ would
    round the norm, and so the factor, to bf16)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads]))
    factor = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for grad in grads:
        grad.copy_(grad.float() * factor)


def build_optimizer(
    model: nn.Module, config: OptimConfig, total_steps: int, fp32_weights: dict[int, torch.Tensor] | None = None
) -> dict:
    """What `LightningModule.configure_optimizers` returns: the optimiser and a per-step scheduler. A model held in
    bf16 (`trainer.precision=bf16-true`) gets fp32 master weights (`MasterWeights`), which start from
    `fp32_weights` (by parameter id(): the weights before the cast) where given."""
    total_steps = config.total_steps or total_steps
    groups = parameter_groups(model, config.weight_decay, row_blocks=config.name == "lamb")
    if config.name == "lamb":

        def make(groups):
            return Lamb(groups, lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay)

    else:
        fused = config.fused
        if fused is None:  # one kernel for all tensors: faster than foreach on CPU too (bench/RESULTS.md)
            fused = all(p.device.type in ("cpu", "cuda") for p in model.parameters())
        for group in groups:
            del group["adapt"]  # LAMB's; AdamW would keep it in its state dict

        def make(groups):
            return torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas), eps=config.eps, fused=fused)

    half = any(p.dtype in (torch.bfloat16, torch.float16) for group in groups for p in group["params"])
    optimizer = MasterWeights(groups, make, fp32_weights) if half else make(groups)
    warmup = config.warmup(total_steps)
    if config.decay_ratio is not None:
        factor = warmup_stable_decay(warmup, total_steps, round(config.decay_ratio * total_steps))
    elif config.decay_power is None:
        factor = linear_warmup_decay(warmup, total_steps)
    else:
        factor = poly_warmup_decay(warmup, total_steps, config.decay_power)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

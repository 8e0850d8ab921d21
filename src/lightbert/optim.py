"""Optimisers and learning-rate schedules shared by every task.

- `optim=adamw`: AdamW as in the paper's Appendix A.2 (beta1 0.9, beta2 0.999, weight decay 0.01), with no decay
  on biases and LayerNorm weights (the reference's `exclude_from_weight_decay`), linear warmup then linear decay
  to 0.
- `optim=lamb`: LAMB (You et al. 2019, Algorithm 2), the large-batch optimiser of NVIDIA's BERT recipe: Adam's
  bias-corrected step plus weight decay, scaled per tensor by the trust ratio ||w|| / ||step||. As in the
  reference LAMB and NVIDIA's (`use_nvlamb=False`), biases and LayerNorm weights get neither weight decay nor the
  trust ratio. Its schedule is NVIDIA's `PolyWarmUpScheduler`: linear warmup, then (1 - step/total)^power.
  It steps all tensors of a group at once with torch's multi-tensor ops (`torch._foreach_*`), as NVIDIA's
  multi-tensor LAMB does in its own kernels; the trust ratios stay on the device.
- `optim=stableadamw` (task=pretrain_modern's): StableAdamW (Wortsman et al. 2023), ModernBERT's optimiser, held to
  torch-optimi's: AdamW with Adam's bias correction in its betas, its learning rate divided per tensor by
  max(1, RMS of g / sqrt(v)) (Adafactor's update clipping, which ModernBERT uses in place of gradient clipping).
- `optim.decouple_lr`: fully decoupled weight decay (StableAdamW and AdamW): each step decays the weights by
  weight_decay x (the scheduled rate / optim.lr), not by lr x weight_decay (ModernBERT's "decoupled" 1e-5).
- `optim.decay_ratio`: warmup-stable-decay instead (the modern recipe's, task=pretrain_modern): the peak rate held
  after warmup, then a 1-sqrt decay to 0 over that last share of the steps.
- A bf16 model (`trainer.precision=bf16-true`) steps fp32 master weights (`MasterWeights`); its gradients are cast
  and its weights rounded back with one multi-tensor copy per group, and clipped with a multi-tensor fp32 norm.
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
    parts, `parameter_groups`).

    `foreach` (None: wherever no parameter is sharded, a DTensor) steps each group with torch's multi-tensor ops
    (`torch._foreach_*`: a few kernels per group and step, where the per-parameter loop launches ~15 per parameter;
    the norms stay on the device, no host sync); the same updates as the loop's to fp32 rounding (tests/test_optim.py).
    """

    def __init__(
        self,
        params,
        lr: float,
        betas=(0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        foreach: bool | None = None,
    ):
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "adapt": True}
        super().__init__(params, {**defaults, "blocks": 1, "foreach": foreach})

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        for group in self.param_groups:  # a state dict saved before these keys existed
            group.setdefault("blocks", 1)
            group.setdefault("foreach", None)

    @torch.no_grad()
    def step(self, closure=None):
        loss = _closure_loss(closure)
        for group in self.param_groups:
            params = _with_moments(self, group, first_step=0)
            for p in params:
                self.state[p]["step"] += 1
            foreach = group["foreach"]
            if foreach is None:
                foreach = not any(_sharded(p) for p in params)
            if params:
                (_lamb_foreach if foreach else _lamb_per_parameter)(group, params, [self.state[p] for p in params])
        return loss


def _lamb_per_parameter(group: dict, params: list[torch.Tensor], states: list[dict]) -> None:
    """One LAMB step of `params`, a parameter at a time."""
    beta1, beta2 = group["betas"]
    for p, state in zip(params, states, strict=True):
        t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
        m.mul_(beta1).add_(p.grad, alpha=1 - beta1)  # m_t
        v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)  # v_t
        # r_t = m_hat / (sqrt(v_hat) + eps), with the bias corrections 1 - beta^t
        update = (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt_().add_(group["eps"]))
        if group["weight_decay"]:
            update.add_(p, alpha=group["weight_decay"])  # r_t + lambda x_t
        if group["adapt"] and group["blocks"] == 1:
            weight_norm, update_norm = p.norm(), update.norm()
            update = update * torch.where((weight_norm > 0) & (update_norm > 0), weight_norm / update_norm, 1.0)
        elif group["adapt"]:  # one trust ratio per block of rows
            update = update * _block_trust(p, update, group["blocks"])
        p.sub_(update, alpha=group["lr"])


def _block_trust(weight: torch.Tensor, update: torch.Tensor, blocks: int) -> torch.Tensor:
    """Each row's trust ratio, (rows, 1, ...): ||w|| / ||update|| of the block of rows it is in. From the rows' sums
    of squares, so that a weight sharded by rows (FSDP's DTensor) gathers only those (one value a row)."""
    dims = tuple(range(1, weight.ndim))
    squares = [t.pow(2).sum(dim=dims) if dims else t.pow(2) for t in (weight, update)]  # (rows,) each
    if _sharded(weight):
        squares = [s.full_tensor() for s in squares]
    weight_norm, update_norm = (s.view(blocks, -1).sum(1).sqrt() for s in squares)  # (blocks,)
    trust = torch.where((weight_norm > 0) & (update_norm > 0), weight_norm / update_norm, 1.0)
    trust = trust.repeat_interleave(weight.shape[0] // blocks).view(-1, *[1] * len(dims))
    if _sharded(weight):
        from torch.distributed.tensor import DTensor, Replicate

        trust = DTensor.from_local(trust, weight.device_mesh, [Replicate()] * weight.device_mesh.ndim, run_check=False)
    return trust


def _lamb_foreach(group: dict, params: list[torch.Tensor], states: list[dict]) -> None:
    """The same step as `_lamb_per_parameter`, each operation once over all of `params` (`torch._foreach_*`)."""
    beta1, beta2 = group["betas"]
    grads = [p.grad for p in params]
    m, v = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
    torch._foreach_mul_(m, beta1)
    torch._foreach_add_(m, grads, alpha=1 - beta1)  # m_t
    torch._foreach_mul_(v, beta2)
    torch._foreach_addcmul_(v, grads, grads, value=1 - beta2)  # v_t
    denominator = torch._foreach_div(v, [1 - beta2 ** s["step"] for s in states])
    torch._foreach_sqrt_(denominator)
    torch._foreach_add_(denominator, group["eps"])
    update = torch._foreach_div(m, [1 - beta1 ** s["step"] for s in states])
    torch._foreach_div_(update, denominator)  # r_t
    del denominator
    if group["weight_decay"]:
        torch._foreach_add_(update, params, alpha=group["weight_decay"])  # r_t + lambda x_t
    if group["adapt"]:  # one trust ratio per block of rows, all computed on the device at once
        blocks = group["blocks"]
        weight_blocks = [b for p in params for b in p.chunk(blocks)]
        update_blocks = [b for u in update for b in u.chunk(blocks)]  # views: scaling them scales `update`
        weight_norm = torch.stack(torch._foreach_norm(weight_blocks))
        update_norm = torch.stack(torch._foreach_norm(update_blocks))
        trust = torch.where((weight_norm > 0) & (update_norm > 0), weight_norm / update_norm, 1.0)
        torch._foreach_mul_(update_blocks, trust.unbind(0))
    torch._foreach_add_(params, update, alpha=-group["lr"])


class StableAdamW(torch.optim.Optimizer):
    """StableAdamW (Wortsman et al. 2023), ModernBERT's optimiser: AdamW whose learning rate is clipped per tensor
    as Adafactor clips its updates, held to torch-optimi's `StableAdamW` (tests/test_optim.py). Each step of a tensor:

    - the moments with Adam's bias correction folded into the betas (optimi's `debias_beta`): m and v are Adam's
      bias-corrected averages m_hat and v_hat;
    - rms = sqrt(mean(g^2 / max(v, eps^2))) over the whole tensor, and lr_t = lr / max(1, rms): a gradient far larger
      than its running average (a spike, or the first step of a tensor) moves the weight less;
    - weight decay w *= 1 - lr_t * wd, or with a group's `decouple_lr` (optimi's, ModernBERT's "decoupled"
      StableAdamW) w *= 1 - lr_t / max_lr * wd: wd a step at the peak rate `max_lr`, whatever that rate;
    - w -= lr_t * m / (sqrt(v) + eps).

    Each operation runs once over a group's tensors (`torch._foreach_*`), and the per-tensor rates stay on the device:
    no host sync (optimi and ModernBERT's copy read each rms with .item(), which waits for the GPU once a tensor).
    The step counts are CPU tensors in each weight's state, as torch's Adam keeps them (what distributed checkpoints
    save). Sharded weights (FSDP2's DTensors) step their local shards, with each rms summed over the whole weight
    (one all-reduce per group).
    """

    def __init__(
        self,
        params,
        lr: float,
        betas=(0.9, 0.99),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        decouple_lr: bool = False,
        max_lr: float | None = None,
    ):
        """`max_lr`: the schedule's peak rate, which `decouple_lr` divides by (None: `lr`)."""
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "decouple_lr": decouple_lr,
            "max_lr": lr if max_lr is None else max_lr,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = _closure_loss(closure)
        for group in self.param_groups:
            params = _with_moments(self, group, first_step=torch.tensor(0))
            if params:
                _stable_adamw_foreach(group, params, [self.state[p] for p in params])
        return loss


def _stable_adamw_foreach(group: dict, params: list[torch.Tensor], states: list[dict]) -> None:
    """One StableAdamW step of `params`, each operation once over all of them (`torch._foreach_*`)."""
    beta1, beta2 = group["betas"]
    steps = [s["step"] for s in states]
    torch._foreach_add_(steps, 1)  # CPU tensors: reading them waits for no device
    beta1_hats = [_debias_beta(beta1, int(t)) for t in steps]
    beta2_hats = [_debias_beta(beta2, int(t)) for t in steps]
    sharded = _sharded(params[0])
    local = (lambda ts: [t.to_local() for t in ts]) if sharded else (lambda ts: ts)
    weights, grads = local(params), local([p.grad for p in params])
    m, v = local([s["exp_avg"] for s in states]), local([s["exp_avg_sq"] for s in states])
    torch._foreach_lerp_(m, grads, [1 - b for b in beta1_hats])  # m_hat
    torch._foreach_mul_(v, beta2_hats)
    torch._foreach_addcmul_(v, grads, grads, [1 - b for b in beta2_hats])  # v_hat
    # rms^2 = mean(g^2 / max(v, eps^2)): the sum of the (non-negative) ratios is their L1 norm
    scratch = torch._foreach_maximum(v, group["eps"] ** 2)  # the step's one buffer of the weights' size
    torch._foreach_reciprocal_(scratch)
    torch._foreach_mul_(scratch, grads)
    torch._foreach_mul_(scratch, grads)
    sums = torch._foreach_norm(scratch, ord=1)
    mean_squares = torch.stack(torch._foreach_div(sums, [p.numel() for p in params]))  # numel: the whole weight's
    if sharded:  # each shard's share is a part of the whole weight's mean
        mean_squares = _summed_over_shards(mean_squares, params[0])
    lrs = group["lr"] / mean_squares.sqrt().clamp(min=1.0)  # lr_t, one a tensor, on the device
    if group["weight_decay"]:
        decay = lrs / group["max_lr"] if group["decouple_lr"] else lrs
        torch._foreach_mul_(weights, (1 - decay * group["weight_decay"]).unbind(0))
    torch._foreach_copy_(scratch, v)
    torch._foreach_sqrt_(scratch)
    torch._foreach_add_(scratch, group["eps"])
    torch._foreach_div_(scratch, lrs.unbind(0))  # (sqrt(v) + eps) / lr_t, as torch's capturable Adam divides
    torch._foreach_addcdiv_(weights, m, scratch, value=-1.0)


def _debias_beta(beta: float, step: int) -> float:
    """Adam's bias correction folded into beta (optimi's `debias_beta`): beta (1 - beta^(t-1)) / (1 - beta^t), so
    that beta_hat m + (1 - beta_hat) g is the bias-corrected average m_t / (1 - beta^t)."""
    return (beta**step - beta) / (beta**step - 1)


def _summed_over_shards(local_sums: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`local_sums` (this rank's sums over its shards of a group's weights, which share `weight`'s mesh and
    placements) summed over the shards of each whole weight: one all-reduce over the mesh's sharded dimensions, none
    over its replicated ones."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    placements = [Partial() if isinstance(p, Shard) else Replicate() for p in weight.placements]
    return DTensor.from_local(local_sums, weight.device_mesh, placements, run_check=False).full_tensor()


def _with_moments(optimizer: torch.optim.Optimizer, group: dict, first_step) -> list[torch.Tensor]:
    """The group's weights that have a gradient, each with Adam's state: a step count (`first_step` at the start: a
    number for LAMB, a CPU tensor for StableAdamW) and the two moments, zeros until its first step."""
    params = [p for p in group["params"] if p.grad is not None]
    for p in params:
        state = optimizer.state[p]
        if not state:
            state["step"] = first_step.clone() if isinstance(first_step, torch.Tensor) else first_step
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    return params


def _sharded(tensor: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


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
        _clip_half_gradients(parameters, max_value, optimizer.foreach)
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

    def __init__(
        self,
        groups: list[dict],
        make_inner,
        fp32_weights: dict[int, torch.Tensor] | None = None,
        foreach: bool | None = None,
    ):
        """`fp32_weights`: the fp32 values of some weights (by the weight's id()) from before the model was cast,
        which their masters start from; the others start from the weights as they are. `foreach` (None: unless a
        weight is sharded) casts the gradients to fp32 and rounds the masters back with one multi-tensor call per
        group (`torch._foreach_copy_`) instead of one per weight."""
        weights = [list(group["params"]) for group in groups]
        self.foreach = not any(_sharded(p) for ws in weights for p in ws) if foreach is None else foreach
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
            pairs = [(p, m) for p, m in zip(group["params"], masters, strict=True) if p.grad is not None]
            if self.foreach:  # each list cast and copied by one multi-tensor call
                fp32 = [torch.empty_like(m) for _, m in pairs]
                if fp32:
                    torch._foreach_copy_(fp32, [p.grad for p, _ in pairs])
                for (_, master), grad in zip(pairs, fp32, strict=True):
                    master.grad = grad
            else:
                for p, master in pairs:
                    master.grad = p.grad.float()
        self.inner.step()
        for group, masters in zip(self.param_groups, self.masters, strict=True):
            for master in masters:
                master.grad = None  # fp32 gradients live only during the step
            if self.foreach and group["params"]:
                torch._foreach_copy_(group["params"], masters)  # rounded to the model's dtype
            elif not self.foreach:
                for p, master in zip(group["params"], masters, strict=True):
                    p.copy_(master)
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


def _clip_half_gradients(parameters: list[torch.Tensor], max_norm: float, foreach: bool = True) -> None:
    """Global-norm clipping of a bf16 model's gradients with the norm summed in fp32 (torch's clip_grad_norm_ would
    round the norm, and so the factor, to bf16). `foreach`: the norms and the scaling as multi-tensor calls (each
    gradient multiplied in fp32 and rounded once, as the per-gradient loop does)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    if foreach:
        norms = torch._foreach_norm(grads, dtype=torch.float32)
    else:
        norms = [torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads]
    norm = torch.linalg.vector_norm(torch.stack(norms))
    factor = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    if foreach:
        torch._foreach_mul_(grads, factor)
        return
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

    elif config.name == "stableadamw":
        for group in groups:
            del group["adapt"]  # LAMB's

        def make(groups):
            return StableAdamW(
                groups, lr=config.lr, betas=config.betas, eps=config.eps, decouple_lr=config.decouple_lr
            )  # max_lr: optim.lr, the schedule's peak

    else:
        fused = config.fused
        if fused is None:  # one kernel for all tensors: faster than foreach on CPU too (bench/RESULTS.md)
            fused = all(p.device.type in ("cpu", "cuda") for p in model.parameters())
        for group in groups:
            del group["adapt"]  # LAMB's; AdamW would keep it in its state dict
            if config.decouple_lr:  # AdamW decays by lr x weight_decay a step: wd / peak lr gives wd x lr / peak
                group["weight_decay"] /= config.lr

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

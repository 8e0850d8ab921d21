"""The contrastive loss of `task=embedding`: InfoNCE with in-batch negatives (sentence-transformers'
MultipleNegativesRankingLoss), over the global batch.

Each anchor's candidates are every positive of the batch and every hard negative (the other rows' positives are its
in-batch negatives); its score for each is `scale` x the cosine similarity, and the loss is the cross-entropy of
picking its own positive. `symmetric` adds the other direction, each positive picking its anchor among the batch's
anchors, and averages the two (MultipleNegativesSymmetricRankingLoss).

Under DDP and FSDP each device's embeddings are gathered with their gradient (`torch.distributed.nn.functional
.all_gather`; `torch.distributed.all_gather` would cut it), so a row's negatives are the whole global batch, not its
device's share: the loss and the gradients equal one process's on the global batch (tests/test_embedding_distributed).

`GradCache` (Gao et al. 2021; sentence-transformers' CachedMultipleNegativesRankingLoss) reaches a large batch on
little memory: the texts are embedded in mini-batches without a graph, the loss and its gradient with respect to
the embeddings are computed on the whole batch, then each mini-batch is embedded again with a graph and
back-propagated from its part of that gradient. Exact, dropout included (each mini-batch's RNG state is replayed),
at the cost of a second forward pass.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lightbert.distributed import is_distributed


def gathered(embeddings: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Every device's `embeddings` (n, H) stacked in rank order (world x n, H), with the gradient flowing back to each
    device's own rows; and where this device's rows start. One process: as they are, 0."""
    if not is_distributed():
        return embeddings, 0
    from torch.distributed.nn.functional import all_gather

    with warnings.catch_warnings():
        # torch 2.13 marks it deprecated in favour of the private `torch.distributed._functional_collectives`: a
        # FutureWarning on every DDP run's console that a user cannot act on. Its gradient is what the loss needs.
        warnings.filterwarnings("ignore", message=".*nn.functional.all_gather is deprecated", category=FutureWarning)
        parts = all_gather(embeddings)
    return torch.cat(parts, dim=0), dist.get_rank() * embeddings.shape[0]


def contrastive_loss(
    anchors: torch.Tensor,
    positives: torch.Tensor,
    negatives: torch.Tensor | None,
    scale: float,
    symmetric: bool = False,
    gather: bool = True,
) -> torch.Tensor:
    """InfoNCE with in-batch negatives: `anchors` and `positives` (B, H), `negatives` (B x k, H) or None, this
    device's rows. With `gather`, every device's rows are the candidates (`gathered`); the loss is the mean over this
    device's anchors, so that DDP's mean of the devices' gradients is the global batch's."""
    if gather:
        all_positives, start = gathered(positives)
        all_negatives = gathered(negatives)[0] if negatives is not None else None
        all_anchors = gathered(anchors)[0] if symmetric else anchors
    else:
        all_positives, start, all_negatives, all_anchors = positives, 0, negatives, anchors
    candidates = all_positives if all_negatives is None else torch.cat([all_positives, all_negatives])
    anchors_n, candidates_n = F.normalize(anchors.float(), dim=-1), F.normalize(candidates.float(), dim=-1)
    targets = torch.arange(start, start + anchors.shape[0], device=anchors.device)  # each anchor's own positive
    loss = F.cross_entropy(scale * anchors_n @ candidates_n.T, targets)  # (B, global B x (1 + k))
    if not symmetric:
        return loss
    positives_n = F.normalize(positives.float(), dim=-1)
    backward = F.cross_entropy(scale * positives_n @ F.normalize(all_anchors.float(), dim=-1).T, targets)
    return (loss + backward) / 2


@contextmanager
def replayed_rng(state: tuple[torch.Tensor, list[torch.Tensor]] | None):
    """Runs its block from the RNG state `state` (CPU, every CUDA device), and puts the state before it back after;
    None: as it is."""
    if state is None:
        yield
        return
    devices = list(range(torch.cuda.device_count())) if state[1] else []
    with torch.random.fork_rng(devices=devices):
        torch.set_rng_state(state[0])
        if state[1]:
            torch.cuda.set_rng_state_all(state[1])
        yield


def rng_state() -> tuple[torch.Tensor, list[torch.Tensor]]:
    return torch.get_rng_state(), (torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [])


class GradCache:
    """The loss of a batch too large to embed with a graph at once (see the module docstring).

    `embed(batch_slice) -> (n, H)` embeds a slice of the batch's texts; `loss(embeddings) -> scalar` is the loss on
    all of them. `__call__` returns that loss, detached, with a hook: the backward pass Lightning runs on it embeds
    each mini-batch again and back-propagates into the parameters. The parameters' gradients are summed over the
    mini-batches, then handed to autograd in one pass (`_hand_over`), so that each parameter's gradient is ready
    once per step, as DDP's reducer counts on (a backward per mini-batch would all-reduce after the first).
    """

    def __init__(self, parameters: Callable[[], list[torch.nn.Parameter]], mini_batch_size: int):
        self.parameters, self.mini_batch_size = parameters, mini_batch_size

    def __call__(
        self,
        count: int,
        embed: Callable[[slice], torch.Tensor],
        loss: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        slices = [slice(i, min(i + self.mini_batch_size, count)) for i in range(0, count, self.mini_batch_size)]
        states, parts = [], []
        with torch.no_grad():
            for part in slices:
                states.append(rng_state())
                parts.append(embed(part))
        cached = torch.cat(parts).detach().requires_grad_()
        with torch.enable_grad():
            value = loss(cached)
            (gradient,) = torch.autograd.grad(value, cached)
        out = value.detach().requires_grad_()
        autocast = _autocast_now()
        out.register_hook(lambda scale: self._backward(scale, slices, states, gradient, embed, autocast))
        return out

    def _backward(self, scale, slices, states, gradient, embed, autocast) -> None:
        params = [p for p in self.parameters() if p.requires_grad]
        sums: list[torch.Tensor | None] = [None] * len(params)
        with torch.enable_grad(), autocast():
            for part, state in zip(slices, states, strict=True):
                with replayed_rng(state):
                    embeddings = embed(part)
                grads = torch.autograd.grad(embeddings, params, gradient[part] * scale, allow_unused=True)
                sums = [g if s is None else s if g is None else s + g for s, g in zip(sums, grads, strict=True)]
        # Autograd runs this hook with grad mode off: without enable_grad the surrogate sum(p * g) has no graph and
        # its backward fails ("element 0 of tensors does not require grad").
        with torch.enable_grad():
            self._hand_over(params, sums)

    @staticmethod
    def _hand_over(params: list[torch.nn.Parameter], sums: list[torch.Tensor | None]) -> None:
        """Accumulates `sums` into the parameters' `.grad` through one autograd pass of sum(p * g): each parameter's
        gradient hooks (DDP's) fire once, with the whole step's gradient."""
        pairs = [(p, g) for p, g in zip(params, sums, strict=True) if g is not None]
        if pairs:
            surrogate = sum((p * g.to(p.dtype)).sum() for p, g in pairs)
            surrogate.backward()


def _autocast_now() -> Callable:
    """The autocast the step runs under (bf16-mixed), to embed again under it in the backward pass, which runs
    outside Lightning's autocast block."""
    for device in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            return lambda: torch.autocast(device, dtype=dtype)
    return _no_autocast


@contextmanager
def _no_autocast():
    yield

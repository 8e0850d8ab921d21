"""The contrastive loss of `task=embedding` on 2 CPU processes (gloo), each holding its half of a global batch of
texts embedded by a small BertForEmbedding, against one process on the whole global batch: what
tests/test_embedding_distributed.py holds the gathered negatives and GradCache under DDP to."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from lightbert.model.embedding import BertForEmbedding
from lightbert.model_config import BertConfig
from lightbert.tasks.embedding.loss import GradCache, contrastive_loss
from lightbert.tasks.embedding.module import split_texts

SIZES = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
SCALE = 20.0
ROWS = 4  # pairs per process
LENGTH = 10  # tokens per text, padding included


def make_model(dropout: float) -> BertForEmbedding:
    """The same weights in every process and every call; in training mode (dropout on where `dropout` > 0)."""
    torch.manual_seed(0)
    config = BertConfig(**SIZES, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    return BertForEmbedding(config).train()


def global_batch(world: int, negatives: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each process's texts as a batch of `task=embedding` lays them out: (input_ids, attention_mask), each
    (ROWS x (2 + negatives), LENGTH): its anchors, its positives, then its rows' hard negatives; right-padded, of
    lengths 3 to LENGTH."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(world):
        count = ROWS * (2 + negatives)
        ids = torch.randint(1, SIZES["vocab_size"], (count, LENGTH), generator=generator)
        lengths = torch.randint(3, LENGTH + 1, (count,), generator=generator)
        mask = (torch.arange(LENGTH)[None] < lengths[:, None]).long()
        batches.append((ids * mask, mask))
    return batches


def chunked(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, size: int | None) -> torch.Tensor:
    """`model`'s embeddings of the texts, `size` at a time (all at once: None), with a graph."""
    size = size or len(ids)
    return torch.cat([model(ids[i : i + size], None, mask[i : i + size]) for i in range(0, len(ids), size)])


def reference(
    model: BertForEmbedding,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    symmetric: bool,
    mini_batch_size: int | None = None,
    seeds: list[int] | None = None,
) -> tuple[float, dict[str, torch.Tensor]]:
    """The loss on the whole global batch in one process, with one graph, and every parameter's gradient. Each
    process's texts are embedded `mini_batch_size` at a time from the RNG seed `seeds[rank]` (where given), the
    dropout masks a process draws when it embeds its own texts in that order."""
    model.zero_grad(set_to_none=True)
    parts = []
    for rank, (ids, mask) in enumerate(batches):
        if seeds is not None:
            torch.manual_seed(seeds[rank])
        parts.append(split_texts(chunked(model, ids, mask, mini_batch_size), ROWS))
    anchors, positives = (torch.cat([part[i] for part in parts]) for i in (0, 1))
    negatives = torch.cat([part[2] for part in parts]) if parts[0][2] is not None else None
    loss = contrastive_loss(anchors, positives, negatives, SCALE, symmetric, gather=False)  # one process: no gather
    loss.backward()
    return loss.item(), gradients(model)


def gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b)
    return max((a[k] - b[k]).abs().max().item() for k in a)


class Step(nn.Module):
    """What EmbeddingModule.training_step computes with GradCache, as the module DDP wraps: its forward embeds the
    texts in mini-batches without a graph and returns the loss, whose backward embeds them again."""

    def __init__(self, model: BertForEmbedding, mini_batch_size: int, symmetric: bool, gather: bool = True):
        super().__init__()
        self.model, self.symmetric, self.gather = model, symmetric, gather
        self.grad_cache = GradCache(self.model.parameters, mini_batch_size)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        def embed(part: slice) -> torch.Tensor:
            return self.model(ids[part], None, mask[part])

        def loss(embeddings: torch.Tensor) -> torch.Tensor:
            return contrastive_loss(*split_texts(embeddings, ROWS), SCALE, self.symmetric, self.gather)

        return self.grad_cache(len(ids), embed, loss)


def mean_over_ranks(value: torch.Tensor) -> float:
    value = value.detach().clone()
    dist.all_reduce(value)
    return value.item() / dist.get_world_size()


def gathered_negatives(rank: int, world: int, results: dict) -> None:
    """Each case (hard negatives or not, symmetric or not): this process's loss on its half with gather=True, its
    gradient averaged over the processes as DDP averages it, against the one-process loss and gradient on the whole
    batch; and the mean loss with gather=False (each process's negatives its own rows only)."""
    for negatives, symmetric in ((0, False), (1, False), (1, True), (0, True)):
        batches = global_batch(world, negatives)
        model = make_model(0.0)
        ids, mask = batches[rank]
        loss = contrastive_loss(*split_texts(model(ids, None, mask), ROWS), SCALE, symmetric, gather=True)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        with torch.no_grad():
            alone = contrastive_loss(*split_texts(model(ids, None, mask), ROWS), SCALE, symmetric, gather=False)
        expected_loss, expected = reference(make_model(0.0), batches, symmetric)
        results[(rank, negatives, symmetric)] = {
            "loss": mean_over_ranks(loss),
            "expected_loss": expected_loss,
            "gradient": largest_difference(gradients(model), expected),
            "not_gathered_loss": mean_over_ranks(alone),
        }


def grad_cache_under_ddp(rank: int, world: int, results: dict) -> None:
    """GradCache inside DistributedDataParallel, dropout on, two steps in a row for each mini-batch size (one that
    divides each process's 12 texts, one that does not) and for gather=False: the gradients DDP leaves in every
    process against the one-process gradients on the whole batch (the same dropout masks: each process's texts
    embedded in its mini-batches from its own seed)."""
    negatives, symmetric = 1, True
    for mini_batch_size, gather in ((2, True), (5, True), (2, False)):
        model = make_model(0.1)
        ddp = nn.parallel.DistributedDataParallel(Step(model, mini_batch_size, symmetric, gather))
        expected_model = make_model(0.1)
        for step in range(2):
            batches = global_batch(world, negatives, seed=10 + step)
            seeds = [100 * step + r for r in range(world)]
            model.zero_grad(set_to_none=True)
            torch.manual_seed(seeds[rank])
            loss = ddp(*batches[rank])
            loss.backward()
            expected_loss, expected = reference(expected_model, batches, symmetric, mini_batch_size, seeds)
            results[(rank, mini_batch_size, gather, step)] = {
                "loss": mean_over_ranks(loss),
                "expected_loss": expected_loss,
                "gradient": largest_difference(gradients(model), expected),
            }
        # The same GradCache step outside DDP: this process's own gradient, which only DDP's all-reduce makes the
        # whole batch's (so the check above sees the surrogate backward reach DDP's reducer).
        torch.manual_seed(seeds[rank])
        model.zero_grad(set_to_none=True)
        ddp.module(*batches[rank]).backward()
        results[(rank, mini_batch_size, gather, "alone")] = largest_difference(gradients(model), expected)


def worker(rank: int, world: int, port: int, job: Callable[[int, int, dict], None], results: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        job(rank, world, results)
    finally:
        dist.destroy_process_group()

"""One optimizer step of BERT sharded with fully_shard over 2 CPU processes (gloo), against the same step of the
unsharded model on the whole batch: what `tests/test_precision.py` holds the FSDP clipping and optimizers to."""

from __future__ import annotations

import copy
import os
import warnings

import torch
import torch.distributed as dist

from lightbert.model import (
    BertConfig,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from lightbert.model.bert import parameter_layout, to_checkpoint
from lightbert.model.embedding import BertForEmbedding
from lightbert.optim import OptimConfig, build_optimizer, clip_gradients
from lightbert.plugins.strategies import shard_bert

CONFIG = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip


def loss_of(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    mlm, nsp = model(input_ids, None, torch.ones_like(input_ids))
    return mlm.pow(2).mean() + nsp.pow(2).mean()


class Stub:
    """What `clip_gradients` reads of a trainer."""

    precision_plugin = None


def largest_rms(optimizer: torch.optim.Optimizer) -> float:
    """The largest RMS of g / sqrt(max(v_hat, eps^2)) over StableAdamW's tensors: above 1, its rate was clipped."""
    ratios = [
        (p.grad.pow(2) / state["exp_avg_sq"].clamp(min=group["eps"] ** 2)).mean().sqrt()
        for group in optimizer.param_groups
        for p in group["params"]
        if (state := optimizer.state[p])
    ]
    return float(max(ratios))


def step(
    rank: int,
    world_size: int,
    port: int,
    optimizer: str,
    max_norm: float,
    checkpointing: bool,
    results: dict,
    spike: bool = False,
) -> None:
    """Rank `rank`'s part: the model sharded by `shard_bert` (with activation checkpointing where `checkpointing`),
    its step on this rank's share of the batch, clipped to `max_norm` (0: not clipped); with `spike`, a second step on
    the loss x 1000 (StableAdamW's update clipping engages). Rank 0 puts the largest difference from the unsharded
    steps, the norm before clipping, whether the decoder is still tied and, with `spike`, the largest RMS of
    StableAdamW's last step in `results`."""
    from torch.distributed._composable.contract import _get_registry
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)
        reference = BertForPreTraining(CONFIG)
        torch.manual_seed(rank)  # another initialisation on each rank: shard_bert starts every rank from rank 0's
        model = BertForPreTraining(CONFIG)
        shard_bert(model, init_device_mesh("cpu", (world_size,)), "32-true", activation_checkpointing=checkpointing)
        input_ids = torch.randint(0, CONFIG.vocab_size, (2 * world_size, 8), generator=torch.Generator().manual_seed(1))
        # The values these tests were measured with (AdamW's defaults for every optimiser), over its recipe's.
        old = {"betas": (0.9, 0.999), "weight_decay": 0.01, "decouple_lr": False, "decay_power": None}
        settings = OptimConfig.recipe(optimizer, warmup_ratio=0, lr=1e-2, **old)
        expected = build_optimizer(reference, settings, 10)["optimizer"]
        sharded = build_optimizer(model, settings, 10)["optimizer"]
        for scale in (1.0, 1000.0) if spike else (1.0,):
            # The mean over devices of each device's mean loss: what FSDP's reduce-scatter averages.
            sum(loss_of(reference, ids) for ids in input_ids.chunk(world_size)).div(world_size).mul(scale).backward()
            if max_norm:
                norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm)
            else:
                norm = torch.nn.utils.get_total_norm([p.grad for p in reference.parameters()])
            loss_of(model, input_ids.chunk(world_size)[rank]).mul(scale).backward()
            clip_gradients(Stub(), sharded, max_norm, "norm")
            expected.step()
            sharded.step()
            if spike and rank == 0:
                results["largest_rms"] = largest_rms(expected)
            expected.zero_grad()
            sharded.zero_grad()
        with parameter_layout(model):  # gathered as the parameters are, then in the checkpoint's layout, as the
            full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        full = to_checkpoint(model, full)  # strategy's checkpoints are (FullyShardedStrategy)
        if rank == 0:
            want = reference.state_dict()
            results["keys"] = sorted(full) == sorted(want)
            results["difference"] = max((full[k] - want[k]).abs().max().item() for k in want)
            results["norm"] = float(norm)
            results["tied"] = model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
            layers = model.bert.encoder.layer
            results["checkpointed"] = sum("checkpoint" in (_get_registry(layer) or {}) for layer in layers)
        # No process tears down gloo while the other still works (as processes.end_process_group): one fresh-clone run
        # saw a process abort (SIGABRT) at the end of this step without it.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def head_models() -> dict[str, tuple[torch.nn.Module, dict[str, torch.Tensor]]]:
    """Each task's model (the root FSDP unit of its runs) and a batch of 4 rows for it. Their outputs that are views by
    design: the MLM logits (narrowed from the padded vocabulary's), Linear's on (B, T, H), SQuAD's unbound start and
    end logits, SWAG's reshaped scores, the [CLS] row of the embeddings."""
    ids = torch.randint(3, CONFIG.vocab_size, (4, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 5:] = mask[3, 6:] = 0  # padded rows too
    batch = {"input_ids": ids, "token_type_ids": (torch.arange(8) >= 4).long().expand(4, 8), "attention_mask": mask}
    choices = {key: value.view(2, 2, 8) for key, value in batch.items()}  # 2 examples of 2 choices: one per rank
    masked = torch.tensor([[1, 2, 3], [0, 4, 4], [5, 6, 7], [2, 3, 5]])  # (B, P): as pre-training runs the MLM head
    torch.manual_seed(0)
    return {
        "pretraining": (BertForPreTraining(CONFIG), {**batch, "masked_positions": masked}),
        "sequence classification": (BertForSequenceClassification(CONFIG, 3), batch),
        "question answering": (BertForQuestionAnswering(CONFIG), batch),
        "token classification": (BertForTokenClassification(CONFIG, 3), batch),
        "multiple choice": (BertForMultipleChoice(CONFIG), choices),
        "embedding": (BertForEmbedding(CONFIG, pooling="cls", normalize=False), batch),
    }


def cubes(output) -> torch.Tensor:
    """A loss that reaches every output: the sum of each output's mean cube. (Not squares: the mean square of a
    LayerNorm's output, the embedding's, is 1 whatever its input, and its gradients would be rounding noise.)"""
    outputs = output if isinstance(output, tuple) else (output,)
    return sum(t.float().pow(3).mean() for t in outputs if t is not None)


def gradients(rank: int, world_size: int, port: int, results: dict) -> None:
    """Rank `rank`'s part, on one thread (forked): each of `head_models` sharded by `shard_bert` (32-true) and its
    backward on this rank's rows, against the unsharded model's on all of them. Puts in `results`, per model (rank 0),
    the largest relative difference of a parameter's gathered gradient from the unsharded one's, ||g - g'|| / ||g'||,
    and, per rank, FSDP's warnings of a unit returning a view."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)  # a forked child: OpenMP's threads do not survive a fork (tests/test_precision.py)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for name, (reference, batch) in head_models().items():
                model = copy.deepcopy(reference)  # the decoder still tied to the word embeddings
                shard_bert(model, mesh, "32-true")
                # The mean over ranks of each rank's mean loss: what FSDP's reduce-scatter averages.
                rows = zip(*(value.chunk(world_size) for value in batch.values()), strict=True)
                shares = [dict(zip(batch, share, strict=True)) for share in rows]  # each rank's rows of the batch
                sum(cubes(reference(**share)) for share in shares).div(world_size).backward()
                cubes(model(**shares[rank])).backward()
                worst = 0.0
                sharded = dict(model.named_parameters())
                for key, want in reference.named_parameters():
                    got = sharded[key].grad.full_tensor()
                    worst = max(worst, ((got - want.grad).norm() / want.grad.norm().clamp(min=1e-30)).item())
                if rank == 0:
                    results[name] = worst
        results[f"view warnings {rank}"] = [str(w.message) for w in caught if "a view tensor" in str(w.message)]
        dist.barrier()  # no process tears down gloo while the other still works (as `step`)
    finally:
        dist.destroy_process_group()

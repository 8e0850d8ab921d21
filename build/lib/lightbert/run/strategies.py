"""Distributed strategies built from config (`trainer=fsdp`), with the wrapping BERT needs."""

from __future__ import annotations

import torch
from lightning.pytorch.strategies import FSDPStrategy

from lightbert.errors import UserError
from lightbert.model.bert import BertLayer


def fsdp_strategy(sharding_strategy: str = "FULL_SHARD", activation_checkpointing: bool = False) -> FSDPStrategy:
    """FSDP with one unit per Transformer block.

    Only `BertLayer`s are wrapped, so the word embeddings and the MLM decoder that shares their weight
    stay in the root unit: a tied parameter must live in one FSDP unit.

    Checkpoints are full state dicts, gathered and written by rank 0 through the trainer's checkpoint IO
    (`AtomicCheckpointIO`): one `last.ckpt` file like every other trainer's, which resumes on any device count
    and converts to Hugging Face as it is. (Sharded checkpoints would be directories written by
    torch.distributed.checkpoint, outside the checkpoint IO, so neither atomic nor loadable by `init_from`.)
    """
    if not torch.cuda.is_available():
        raise UserError(
            "trainer=fsdp needs CUDA GPUs (FSDP shards over NCCL) and none is visible here; "
            "use trainer=cpu, or trainer=gpu / trainer=ddp on a GPU machine"
        )
    layers = {BertLayer}
    return FSDPStrategy(
        auto_wrap_policy=layers,
        activation_checkpointing_policy=layers if activation_checkpointing else None,
        sharding_strategy=sharding_strategy,
        state_dict_type="full",
    )

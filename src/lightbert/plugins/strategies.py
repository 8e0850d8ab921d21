"""Distributed strategies built from config (`trainer=fsdp`), with the sharding BERT needs.

FSDP here is torch's FSDP2 (`fully_shard`, parameters as DTensors) through Lightning's `ModelParallelStrategy`:
it runs on CUDA GPUs over NCCL and on CPU processes over gloo, which is how the tests run it. torch's FSDP1
(Lightning's `FSDPStrategy`) is not used: nothing in lightbert needs it, torch deprecates it, and it runs on GPUs only.
"""

from __future__ import annotations

import itertools

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils._pytree import tree_map_only

from lightbert.errors import ConfigError
from lightbert.model.bert import BertLayer, from_checkpoint, parameter_layout, to_checkpoint

# trainer.strategy.sharding_strategy -> fully_shard's reshard_after_forward. FULL_SHARD frees each block's gathered
# weights after its forward and gathers them again for its backward; SHARD_GRAD_OP keeps them until the backward
# (more memory, one all-gather fewer per block and step). FSDP1's other choices are other strategies here.
RESHARD_AFTER_FORWARD = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}
ELSEWHERE = {"NO_SHARD": "trainer=ddp (every device holds the whole model)"}


class FullyShardedStrategy(ModelParallelStrategy):
    """FSDP2 over every process of the job: each process holds 1/world of each Transformer block and of the root
    unit (the embeddings, the pooler and the heads, the MLM decoder whose weight is the word embeddings': a tied
    parameter must live in one unit).

    Checkpoints are full state dicts, gathered and written by rank 0 through the trainer's checkpoint IO
    (`AtomicCheckpointIO`): one `last.ckpt` file like every other trainer's, which resumes on any device count, loads
    with init_from and converts to Hugging Face as it is. (Sharded checkpoints would be directories written by
    torch.distributed.checkpoint, outside the checkpoint IO, so neither atomic nor loadable by `init_from`.)

    The task modules call `shard` from `configure_model`, the hook Lightning runs once the processes and their
    device mesh exist.
    """

    def __init__(self, reshard_after_forward: bool = True, activation_checkpointing: bool = False) -> None:
        super().__init__(save_distributed_checkpoint=False)
        self.reshard_after_forward = reshard_after_forward
        self.activation_checkpointing = activation_checkpointing

    def _setup_distributed(self) -> None:
        super()._setup_distributed()
        # One dimension, data parallel over every process (Lightning's default would make the devices of a node a
        # tensor-parallel group, which lightbert's model does not define).
        self._data_parallel_size, self._tensor_parallel_size = self.world_size, 1

    def lightning_module_state_dict(self) -> dict:
        # torch.distributed.checkpoint maps every state-dict key onto a parameter of its shape: it gathers them as
        # they are (the fused attention projections, the padded vocabulary), and the checkpoint gets transformers'
        # layout from them (`lightbert.model.bert.CheckpointLayout`).
        with parameter_layout(self.model):
            state = super().lightning_module_state_dict()
        return to_checkpoint(self.model, state)

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict:
        # Validation and prediction read the weights alone (a best-*.ckpt holds nothing else), whatever optimizers
        # an earlier fit of this trainer left (Lightning's strategy would look for their states in the file).
        if self.lightning_module.trainer.state.fn == TrainerFn.FITTING:
            return self._load_joined(checkpoint_path, weights_only)
        optimizers, self.optimizers = self.optimizers, []
        try:
            return self._load_joined(checkpoint_path, weights_only)
        finally:
            self.optimizers = optimizers

    def _load_joined(self, checkpoint_path, weights_only: bool | None) -> dict:
        """Lightning's load of a full checkpoint file (`_load_checkpoint`), its weights turned into the parameters'
        layout first: the file holds transformers' (query, key and value apart, the vocabulary's rows), and the
        sharded model is filled parameter by parameter, by name and shape (qkv, padded rows)."""
        from pathlib import Path

        from lightning.fabric.strategies import model_parallel
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        path = Path(self.broadcast(checkpoint_path))
        if not model_parallel._is_full_checkpoint(path):
            return super().load_checkpoint(checkpoint_path, weights_only)  # a sharded directory: none of lightbert's
        strict = self.lightning_module.strict_loading
        checkpoint = torch.load(path, mmap=True, map_location="cpu", weights_only=weights_only)
        weights = from_checkpoint(self.model, checkpoint.pop("state_dict"))
        model_parallel._load_raw_module_state(weights, self.model, strict=strict)
        options = StateDictOptions(broadcast_from_rank0=True, full_state_dict=True, strict=strict)
        for index, optimizer in enumerate(self.optimizers):
            state = model_parallel._rekey_optimizer_state_if_needed(checkpoint["optimizer_states"][index], self.model)
            set_optimizer_state_dict(self.model, optimizer, optim_state_dict=state, options=options)
        return checkpoint

    def shard(self, module: L.LightningModule) -> None:
        """`shard_bert` on `module.model`, on this process's device, with the trainer's precision."""
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor

        if isinstance(module.model, FSDPModule):
            return  # sharded by an earlier fit, validate or predict of this module
        module.model.to(self.root_device)
        shard_bert(
            module.model,
            self.device_mesh["data_parallel"],
            self.precision_plugin.precision,
            self.reshard_after_forward,
            self.activation_checkpointing,
        )
        unsharded = [name for name, p in module.named_parameters() if not isinstance(p, DTensor)]
        if unsharded:  # their gradients would never be reduced across processes
            raise RuntimeError(f"{type(module).__name__} has parameters outside its model, not sharded: {unsharded}")


def shard_bert(
    model: torch.nn.Module,
    mesh,
    precision: str,
    reshard_after_forward: bool = True,
    activation_checkpointing: bool = False,
) -> None:
    """`fully_shard` on each `BertLayer` of `model`, then on `model` itself (the root unit), over the 1-D device mesh.

    Every process starts from rank 0's weights (as DDP does): FSDP2 shards what each process holds, and a model
    initialised differently on two processes would be trained as a mix of the two."""
    from torch.distributed._composable import checkpoint
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    for tensor in {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}.values():
        torch.distributed.broadcast(tensor.data, src=mesh.mesh[0].item(), group=mesh.get_group())
    policy = MixedPrecisionPolicy()
    if precision == "bf16-mixed":
        # Weights gathered in bf16 (half the traffic; autocast computes in bf16 anyway), gradients reduced in fp32
        # into the fp32 shards the optimizer steps.
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.modules():
        if isinstance(layer, BertLayer):
            if activation_checkpointing:
                checkpoint(layer)  # its activations are recomputed in the backward, not kept
            fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
            layer.register_forward_hook(outputs_not_views, prepend=True)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    model.register_forward_hook(outputs_not_views, prepend=True)


@torch.compiler.disable  # beside FSDP's own post-forward hook, which Dynamo does not trace either
def outputs_not_views(module: torch.nn.Module, inputs, output):
    """`module`'s outputs, each one that is a view copied into a tensor of its own; a forward hook of each FSDP unit,
    run before FSDP's own (`prepend`).

    FSDP2 hooks the backward of each output of a unit (where it gathers the unit's weights again) and warns of every
    output that is a view: an in-place op on one would drop that hook, and the gather with it. The root unit is the
    task's whole model, whose heads return views by design: the MLM logits narrowed from the padded vocabulary's, a
    Linear's on (B, T, H) (a view of its 2-D GEMM), SQuAD's start and end logits unbound, SWAG's scores reshaped. A
    copy holds the same numbers: for the MLM logits one more pass over them (M x V), made under FSDP only and only
    where a backward follows."""
    if not torch.is_grad_enabled():  # no backward to hook (validation, prediction): FSDP leaves the outputs alone
        return output

    def own(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.clone() if tensor._base is not None and tensor.requires_grad else tensor

    return tree_map_only(torch.Tensor, own, output)


def fsdp_strategy(
    sharding_strategy: str = "FULL_SHARD", activation_checkpointing: bool = False
) -> FullyShardedStrategy:
    """`trainer.strategy` of trainer=fsdp / fsdp8."""
    if sharding_strategy not in RESHARD_AFTER_FORWARD:
        instead = ELSEWHERE.get(sharding_strategy)
        raise ConfigError(
            f"trainer.strategy.sharding_strategy={sharding_strategy} is not one of "
            f"{', '.join(RESHARD_AFTER_FORWARD)}" + (f"; for it use {instead}" if instead else "")
        )
    return FullyShardedStrategy(RESHARD_AFTER_FORWARD[sharding_strategy], activation_checkpointing)

"""Optimisers: the defaults change speed, never the numbers."""

import torch
from test_model import TINY, random_batch

from lightbert.model import BertForPreTraining
from lightbert.optim import OptimConfig, build_optimizer


def train_steps(fused: bool, steps: int = 12) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = BertForPreTraining(TINY)
    config = OptimConfig(lr=1e-3, warmup_steps=3, fused=fused)
    optimizer = build_optimizer(model, config, total_steps=steps)
    input_ids, token_type_ids, attention_mask = random_batch()
    for _ in range(steps):
        mlm, nsp = model(input_ids, token_type_ids, attention_mask)
        (mlm.float().logsumexp(-1).mean() + nsp.sum()).backward()
        optimizer["optimizer"].step()
        optimizer["lr_scheduler"]["scheduler"].step()
        optimizer["optimizer"].zero_grad()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_fused_adamw_equals_the_foreach_implementation():
    """optim.fused=null picks the fused kernel on CPU (bench/RESULTS.md): same weights after 12 steps."""
    model = BertForPreTraining(TINY)
    assert build_optimizer(model, OptimConfig(), total_steps=10)["optimizer"].defaults["fused"] is True
    fused, foreach = train_steps(fused=True), train_steps(fused=False)
    for name, weight in foreach.items():
        torch.testing.assert_close(fused[name], weight, atol=1e-6, rtol=1e-5, msg=name)

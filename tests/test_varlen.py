"""speed.unpad=varlen: variable-length attention over the real tokens (unpadded batches) or the flattened rows
(packed batches). Its results equal the other paths' in test_model, test_objectives and test_packing (through the
CPU's one-sequence-at-a-time path); here: the sequences it is given, the flash call that a CUDA GPU makes (checked on
the meta device: no GPU here), and which path `speed.unpad=true` picks where."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from test_packing import CONFIG, WIDTH, masking, sentence_pairs

from lightbert.model import BertForPreTraining
from lightbert.model.varlen import Segments, segmentwise_attention, varlen_attention
from lightbert.run.speed import unpadding_for
from lightbert.tasks.pretraining.packing import PackingCollator, packed_rows


def test_packed_rows_are_each_example_then_the_padding_as_sequences():
    """Row after row: the K slots' examples (an empty slot: an empty sequence) and the row's padding, B x (K + 1)
    sequences whatever the rows hold, read from the packed batch itself."""
    packed = PackingCollator(masking(), WIDTH, max_examples_per_row=4)(sentence_pairs(13, seed=3))
    rows, slots = packed["cls_positions"].shape
    expected, start = [0], 0
    for r in range(rows):
        documents = packed["document_ids"][r].tolist()
        for slot in range(1, slots + 1):
            start += documents.count(slot)
            expected.append(start)
        start += documents.count(0)  # the padding, as one more sequence
        expected.append(start)
    assert start == rows * WIDTH
    assert any(packed["example_index"][r, -1] < 0 for r in range(rows))  # an empty slot among them
    segments = Segments.of_packed_rows(packed["document_ids"], slots)
    assert segments.cu_seqlens.dtype == torch.int32 and segments.cu_seqlens.tolist() == expected
    assert segments.max_len == WIDTH


def test_segments_of_a_padded_batch_are_its_real_tokens_in_order():
    attention_mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    segments = Segments.of_padded(attention_mask)
    assert segments.cu_seqlens.tolist() == [0, 3, 4, 8] and segments.max_len == 4


@pytest.mark.parametrize("is_causal", [False, True])
def test_segmentwise_attention_is_attention_under_the_block_diagonal_mask(is_causal):
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 11, 2, 8).unbind(0)  # (N, A, D)
    cu = torch.tensor([0, 4, 4, 9, 11], dtype=torch.int32)  # with an empty sequence
    sequence = torch.tensor([0] * 4 + [2] * 5 + [3] * 2)
    mask = sequence[:, None] == sequence[None, :]
    if is_causal:
        mask &= torch.ones(11, 11, dtype=torch.bool).tril()
    dense = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(0, 1) for t in (q, k, v)), attn_mask=mask)
    out = segmentwise_attention(q, k, v, cu, 0.0, is_causal)
    torch.testing.assert_close(out, dense.transpose(0, 1), atol=1e-6, rtol=1e-6)


def packed_varlen_on_meta():
    """The bf16 model on the meta device, attending through varlen, and a packed batch of 12 sentence pairs there."""
    packed = PackingCollator(masking(), WIDTH, max_examples_per_row=4)(sentence_pairs(12))
    net = BertForPreTraining(CONFIG).to("meta", torch.bfloat16).train()
    net.bert.set_unpadding("varlen")
    return net, {k: v.to("meta") for k, v in packed.items()}


def test_the_flash_call_takes_the_packed_model_forward_and_backward_on_the_meta_device():
    """What a CUDA GPU in bf16 runs, down to `aten._flash_attention_forward` and its backward, with torch's meta
    kernels checking every argument and shape: the flattened rows (B·T, A, D), int32 boundaries, dropout."""
    net, batch = packed_varlen_on_meta()
    flash = torch.ops.aten._flash_attention_forward
    with (
        mock.patch("lightbert.model.varlen.flash_varlen_supported", lambda q: q.dtype == torch.bfloat16),
        mock.patch("torch.ops.aten._flash_attention_forward", side_effect=flash) as called,
    ):
        mlm, nsp = net(
            batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["masked_positions"],
            packed=packed_rows(batch),
        )  # fmt: skip
        (mlm.float().sum() + nsp.float().sum()).backward()
    assert called.call_count == CONFIG.num_hidden_layers
    q, _, _, cu_q, cu_k, max_q, max_k, dropout_p, is_causal, _ = called.call_args.args
    rows = batch["input_ids"].shape[0]
    assert q.shape == (rows * WIDTH, CONFIG.num_attention_heads, CONFIG.head_size) and q.dtype == torch.bfloat16
    assert cu_q is cu_k and cu_q.shape == (rows * 5 + 1,) and cu_q.dtype == torch.int32
    assert (max_q, max_k, dropout_p, is_causal) == (WIDTH, WIDTH, CONFIG.attention_probs_dropout_prob, False)
    qkv = net.bert.encoder.layer[0].attention.self.qkv.weight
    assert qkv.grad is not None and qkv.grad.shape == qkv.shape


def test_the_flash_call_of_unpadded_tokens_on_the_meta_device():
    """Fine-tuning's varlen path hands the real tokens (N, A, D) as the Linear layers left them; eval: no dropout."""
    q, k, v = (torch.empty(37, 64, device="meta", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    segments = Segments(torch.zeros(5, dtype=torch.int32, device="meta"), 16)
    with mock.patch("lightbert.model.varlen.flash_varlen_supported", return_value=True):
        out = varlen_attention(q, k, v, segments, heads=4, dropout_p=0.0, is_causal=True)
    out.float().sum().backward()
    assert out.shape == (37, 64) and q.grad.shape == (37, 64)


@pytest.mark.parametrize(
    ("setting", "on_cuda", "precision", "packing", "how", "says"),
    [
        (True, False, "32-true", False, "groups", "skipped, attention in length groups (speed.unpad=true on cpu"),
        (True, True, "bf16-mixed", False, "off", "padding: kept (speed.unpad=true on a CUDA GPU, bf16-mixed: padded"),
        (True, True, "bf16-mixed", True, "off", "within itself through a (T, T) mask (speed.unpad=true on a CUDA"),
        (True, True, "32-true", True, "off", "within itself through a (T, T) mask"),
        (True, False, "32-true", True, "groups", "within itself through a (T, T) mask (speed.unpad=true on cpu"),
        ("varlen", True, "bf16-true", False, "varlen", "attention through flash attention's variable-length kernel"),
        ("varlen", True, "bf16-mixed", True, "varlen", "within itself through flash attention's variable-length"),
        ("varlen", False, "32-true", False, "varlen", "one sequence at a time (the variable-length kernel needs"),
        (False, True, "bf16-mixed", False, "off", "padding: kept (speed.unpad=false"),
        ("groups", True, "bf16-mixed", True, "groups", "through a (T, T) mask (speed.unpad=groups"),
        ("groups", True, "bf16-mixed", False, "groups", "in length groups (speed.unpad=groups on a CUDA GPU"),
    ],
)
def test_speed_unpad_true_picks_by_the_device_and_says_which(setting, on_cuda, precision, packing, how, says):
    """true: on a CUDA GPU the padded path for unpadded batches and the (T, T) mask for packed rows (what the H100
    measured; varlen waits for `pytest -m gpu`); length groups on a CPU; a named path is that path."""
    picked, line = unpadding_for(setting, on_cuda, precision, packing)
    assert picked == how and line.startswith("padding: ") and says in line, line


def test_unpadded_batches_run_padded_on_a_gpu_by_default():
    """The H100 measured length groups at 0.59x transformers for a fine-tuning step and at no gain for pre-training:
    `speed.unpad=true` on CUDA runs the padded path, and the run line says why; a CPU keeps length groups."""
    for packing in (False, True):
        picked, line = unpadding_for(True, True, "bf16-mixed", packing)
        assert picked == "off" and "padded on a GPU, as measured fastest there" in line, line
    assert unpadding_for(True, False, "32-true", False)[0] == "groups"


@pytest.mark.parametrize(("setting", "on_cuda"), [(True, False), ("groups", False), ("groups", True)])
def test_fsdp_runs_padded_batches_in_place_of_length_groups_and_says_why(setting, on_cuda):
    """Under FSDP every device must run each block's all-gathers in step with the others: no length groups."""
    picked, line = unpadding_for(setting, on_cuda, "bf16-mixed", False, sharded=True)
    assert picked == "off" and "padded under trainer=fsdp" in line, line
    assert unpadding_for("varlen", on_cuda, "bf16-mixed", False, sharded=True)[0] == "varlen"  # one call per block
    assert unpadding_for(False, on_cuda, "bf16-mixed", False, sharded=True)[0] == "off"


def test_the_speed_switches_set_the_encoders_unpadding_and_it_takes_only_known_modes(tmp_path):
    """apply_speed_switches hands speed.unpad to the head's encoder (`BertModel.set_unpadding`), which refuses a mode
    it does not know and keeps the one it had."""
    from helpers.runs import compose_config, run_settings

    from lightbert.run.speed import apply_speed_switches
    from lightbert.run.speed_settings import SpeedSettings
    from lightbert.tasks.glue.module import SequenceClassificationModule

    module = SequenceClassificationModule(CONFIG.to_dict(), {"lr": 1e-4, "warmup_ratio": 0.01}, task="sst2")
    trainer = run_settings(compose_config(["trainer=cpu"], tmp_path)).trainer
    for setting, how in ((False, "off"), ("varlen", "varlen"), (True, "groups")):  # true: length groups on a CPU
        apply_speed_switches(
            module, SpeedSettings(unpad=setting), trainer, packing=False, compiles=False, training=False
        )
        assert module.model.bert.unpad == how, setting
    with pytest.raises(ValueError, match="BertModel.set_unpadding takes one of off, groups, varlen, got 'auto'"):
        module.model.bert.set_unpadding("auto")
    assert module.model.bert.unpad == "groups"


def test_a_gpu_without_flash_runs_varlen_one_sequence_at_a_time_and_says_so_once(caplog):
    """Flash attention needs compute capability 8.0 and a torch built with it: on a V100 (7.0), or a build without
    flash, `flash_varlen_supported` says no for a bf16 CUDA tensor (checked on a fake CUDA tensor), with one warning
    per device; an H100 says yes."""
    from helpers.cuda_rules import fake_cuda

    from lightbert.model import varlen

    with fake_cuda():
        q = torch.empty(37, 4, 64, device="cuda", dtype=torch.bfloat16)
    cases = [((7, 0), True, False), ((9, 0), False, False), ((9, 0), True, True)]
    for capability, built, supported in cases:
        with (
            mock.patch.dict(varlen._FLASH_DEVICES, clear=True),
            mock.patch("torch.cuda.get_device_capability", return_value=capability),
            mock.patch("torch.cuda.get_device_name", return_value="a GPU"),
            mock.patch("torch.backends.cuda.is_flash_attention_available", return_value=built),
            caplog.at_level("WARNING", logger="lightbert.model.varlen"),
        ):
            caplog.clear()
            assert [varlen.flash_varlen_supported(q) for _ in range(3)] == [supported] * 3, capability
            warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == (0 if supported else 1), warnings
        if not supported:
            assert "varlen attention runs one sequence at a time on cuda:0" in warnings[0]


def test_the_packed_varlen_model_compiles_to_one_graph_on_the_meta_device():
    """The CUDA path under torch.compile (aot_eager, on meta tensors): batches of different row counts, forward and
    backward, no graph break, no recompile: the boundaries have a fixed shape and nothing is read on the host."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    net = BertForPreTraining(CONFIG).to("meta", torch.bfloat16).train()
    net.bert.set_unpadding("varlen")
    net.compile(backend="aot_eager")
    collate = PackingCollator(masking(), WIDTH)
    rows = set()
    with mock.patch("lightbert.model.varlen.flash_varlen_supported", lambda q: q.dtype == torch.bfloat16):
        for seed, count in enumerate((16, 24, 9, 30)):
            batch = {k: v.to("meta") for k, v in collate(sentence_pairs(count, seed=seed)).items()}
            for tensor in batch.values():
                torch._dynamo.maybe_mark_dynamic(tensor, 0)  # as PreTrainingModule._step marks them
            rows.add(batch["input_ids"].shape[0])
            mlm, nsp = net(
                batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["masked_positions"],
                packed=packed_rows(batch),
            )  # fmt: skip
            (mlm.float().sum() + nsp.float().sum()).backward()
    assert len(rows) > 1
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


def test_the_flash_calls_of_a_packed_step_pass_cudas_checks_forward_and_backward():
    """The model's flash calls on the meta device (every layer's), replayed on fake CUDA tensors through CUDA's meta
    kernels: the forward, and its backward op called directly with the forward's outputs (autograd's engine on fake
    CUDA leaves needs a CUDA build). The random state for dropout's replay comes back on the GPU."""
    from helpers.cuda_rules import Operand, fake_cuda
    from torch.utils._pytree import tree_map_only

    net, batch = packed_varlen_on_meta()
    flash = torch.ops.aten._flash_attention_forward
    with (
        mock.patch("lightbert.model.varlen.flash_varlen_supported", lambda q: q.dtype == torch.bfloat16),
        mock.patch("torch.ops.aten._flash_attention_forward", side_effect=flash) as called,
    ):
        net(
            batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["masked_positions"],
            packed=packed_rows(batch),
        )  # fmt: skip
    assert called.call_count == CONFIG.num_hidden_layers
    for call in called.call_args_list:
        recorded = tree_map_only(torch.Tensor, Operand.of, call.args)
        with fake_cuda():
            q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, is_causal, _ = tree_map_only(
                Operand, Operand.on_fake_cuda, recorded
            )
            out, lse, rng_state, unused, _ = flash(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, is_causal, False)
            grads = torch.ops.aten._flash_attention_backward(
                torch.empty_like(out), q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dropout_p, is_causal, rng_state,
                unused,
            )  # fmt: skip
        assert out.shape == q.shape and out.device.type == "cuda" and rng_state.device.type == "cuda"
        assert [g.shape for g in grads] == [q.shape, k.shape, v.shape] and dropout_p > 0

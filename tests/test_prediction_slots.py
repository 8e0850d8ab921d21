"""Fixed prediction slots for every pre-training batch (`masked_positions`, `max_predictions_per_seq` per row): the
gathered MLM head gives the boolean path's losses and accuracy, transformers' logits, one graph under torch.compile
with no recompilation, and passes CUDA's checks."""

from __future__ import annotations

import pytest
import torch
import transformers
from test_packing import CONFIG, VOCAB, WIDTH, model, sentence_pairs

from lightbert.data.encoding import IGNORE_INDEX
from lightbert.model import BertForPreTraining
from lightbert.tasks.pretraining.masking import MaskingCollator, max_predictions_for, prediction_positions
from lightbert.tasks.pretraining.module import PreTrainingModule

SLOTS = 12  # above any row's 15% of at most 60 tokens (9), so the cap never binds here


def collator(pad_to_multiple_of: int | None = None, slots: int = SLOTS) -> MaskingCollator:
    return MaskingCollator(
        vocab_size=VOCAB, pad_id=0, mask_id=3, special_ids=[0, 1, 2, 3, 4], max_predictions_per_seq=slots,
        pad_to_multiple_of=pad_to_multiple_of,
    )  # fmt: skip


def test_the_derived_width_is_the_papers_and_a_setting_overrides_it():
    assert max_predictions_for(128, 0.15) == 20 and max_predictions_for(512, 0.15) == 80
    assert max_predictions_for(8, 0.15) == 4 and max_predictions_for(2, 0.15) == 2  # never wider than the row
    from lightbert.tasks.pretraining.corpus import DemoCorpus
    from lightbert.tasks.pretraining.datamodule import PretrainDataModule

    derived = PretrainDataModule(DemoCorpus(), cache_dir="unused", max_seq_length=512)
    assert derived.max_predictions_per_seq == 80
    assert PretrainDataModule(DemoCorpus(), "unused", max_predictions_per_seq=7).max_predictions_per_seq == 7


def test_the_slots_hold_every_prediction_in_order_and_the_rest_point_at_an_unlabelled_position():
    batch = collator()(sentence_pairs(32))
    labels, positions = batch["labels"], batch["masked_positions"]
    assert positions.shape == (32, SLOTS) and positions.dtype == torch.long
    for row in range(32):
        predicted = (labels[row] != IGNORE_INDEX).nonzero().squeeze(1)
        assert 1 <= len(predicted) < SLOTS
        assert positions[row, : len(predicted)].tolist() == predicted.tolist()
        assert (labels[row, positions[row, len(predicted) :]] == IGNORE_INDEX).all()  # padding slots: no label
    # Exactly the boolean mask's labels, in its (row-major) order, plus IGNORE_INDEX for the padding slots.
    gathered = labels.gather(1, positions).flatten()
    assert gathered[gathered != IGNORE_INDEX].tolist() == labels[labels != IGNORE_INDEX].tolist()
    with pytest.raises(ValueError, match="a row has 3 predictions and room for 2"):
        prediction_positions(torch.tensor([[IGNORE_INDEX, 5, 6, 7, IGNORE_INDEX]]), 2)


def test_a_row_is_never_masked_beyond_its_slots_and_the_shares_hold_under_the_cap():
    """The cap binds (4 slots, rows of up to 60 tokens): every row gets min(its 15%, 4) predictions, every one in a
    slot, and 80/10/10 still holds among them."""
    c = collator(slots=4)
    c.generator = torch.Generator().manual_seed(0)
    chosen = as_mask = 0
    for seed in range(20):
        examples = sentence_pairs(64, seed=seed)
        batch = c([{k: v for k, v in e.items() if k != "mask_seed"} for e in examples])
        predicted = batch["labels"] != IGNORE_INDEX
        real = torch.tensor([len(e["input_ids"]) - 3 for e in examples])
        assert torch.equal(predicted.sum(1), (real * 0.15).round().long().clamp(min=1, max=4))
        gathered = batch["labels"].gather(1, batch["masked_positions"])
        assert int((gathered != IGNORE_INDEX).sum()) == int(predicted.sum())
        chosen += int(predicted.sum())
        as_mask += int((batch["input_ids"][predicted] == 3).sum())
    assert as_mask / chosen == pytest.approx(0.8, abs=0.03)  # ~4.5k choices: a standard error of 0.6 points


def test_fixed_slots_give_the_boolean_paths_losses_accuracy_and_gradients():
    module = PreTrainingModule(CONFIG.to_dict(), {"lr": 1e-4, "warmup_ratio": 0.01})
    module.model.load_state_dict(model().state_dict())
    module.eval()
    batch = collator()(sentence_pairs(16, seed=3))
    boolean = {k: v for k, v in batch.items() if k != "masked_positions"}  # the module falls back to labels != -100
    labels = batch["labels"][batch["labels"] != IGNORE_INDEX]
    with torch.no_grad():  # every position predicts the commonest label: an accuracy above 0 to compare
        module.model.cls.predictions.bias[labels.mode().values] += 50.0
    results = {}
    for name, b in (("slots", batch), ("boolean", boolean)):
        module.zero_grad()
        out = module._step(b)
        out["loss"].backward()
        results[name] = out, {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    (slots, slot_grads), (reference, grads) = results["slots"], results["boolean"]
    assert 0 < float(reference["mlm_accuracy"]) < 1
    for name in ("loss", "mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy", "num_predictions"):
        torch.testing.assert_close(slots[name], reference[name], rtol=1e-6, atol=1e-6, msg=name)
    assert slot_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(slot_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_the_gathered_head_gives_transformers_logits_and_loss():
    """transformers' BertForPreTraining, the same weights, every position's logits: ours at the slots are its rows
    there, and the module's MLM + NSP loss is its loss."""
    ours = model()
    hf = transformers.BertForPreTraining(transformers.BertConfig(**CONFIG.to_dict(), attn_implementation="sdpa"))
    state = ours.state_dict()
    state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
    hf.load_state_dict(state, strict=True)
    hf.eval()
    batch = collator()(sentence_pairs(16, seed=4))
    module = PreTrainingModule(CONFIG.to_dict(), {"lr": 1e-4, "warmup_ratio": 0.01})
    module.model.load_state_dict(ours.state_dict())
    module.eval()
    inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    with torch.no_grad():
        mlm, _ = ours(**inputs, masked_positions=batch["masked_positions"])
        reference = hf(**inputs, labels=batch["labels"], next_sentence_label=batch["next_sentence_label"])
        loss = module._step(batch)["loss"]
    positions = batch["masked_positions"][:, :, None].expand(-1, -1, VOCAB)
    torch.testing.assert_close(mlm, reference.prediction_logits.gather(1, positions), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, reference.loss, atol=1e-5, rtol=1e-5)


def test_the_compiled_padded_step_is_one_graph_with_no_break_or_recompilation():
    """Padded batches of one width (what CUDA graphs and a full-length batch give), each with its own number of
    masked tokens: the model and the losses compile once each (aot_eager: Dynamo's and AOTAutograd's graphs, without
    Inductor's C++ compile time), forward and backward, and no later batch breaks or recompiles a graph."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    module = PreTrainingModule(CONFIG.to_dict(), {"lr": 1e-4, "warmup_ratio": 0.01})
    module.model.bert.set_unpadding("off")  # speed.unpad=true on a CUDA GPU
    module.compile_step(backend="aot_eager")
    c = collator(pad_to_multiple_of=WIDTH)
    counts = set()
    for seed in range(4):
        batch = c(sentence_pairs(8, seed=seed))
        counts.add(int((batch["labels"] != IGNORE_INDEX).sum()))
        module._step(batch)["loss"].backward()
        if seed == 0:
            warm = counters["stats"]["unique_graphs"]
    assert len(counts) > 1  # the boolean path's shape would have changed
    assert dict(counters["graph_break"]) == {}
    assert warm == 2 and counters["stats"]["unique_graphs"] == warm  # the model's graph and the losses'
    torch._dynamo.reset()


def test_the_gathered_head_passes_cudas_checks_in_bf16():
    """The encoder and the gathered MLM head on fake CUDA tensors (CUDA's meta kernels, tests/helpers/cuda_rules.py):
    bf16 weights, full-width rows, integer slots; the logits come out (B, slots, V) on the GPU."""
    from helpers.cuda_rules import fake_cuda

    batch = collator(pad_to_multiple_of=WIDTH)(sentence_pairs(8, seed=5))
    # Without the NSP head and its pooler, whose [CLS] slice a fake CUDA tensor cannot take without a CUDA build.
    net = BertForPreTraining(CONFIG, next_sentence=False).to("meta").eval()
    with fake_cuda():  # fakes hold shapes, dtypes and devices, no values; the weights go in by functional_call
        weights = {n: torch.empty(p.shape, dtype=torch.bfloat16, device="cuda") for n, p in net.named_parameters()}
        cuda = {k: torch.empty(v.shape, dtype=v.dtype, device="cuda") for k, v in batch.items()}
        # No attention mask: a fake CUDA tensor's cast to bool needs a CUDA build; full-width rows need none.
        inputs = (cuda["input_ids"], cuda["token_type_ids"], None, cuda["masked_positions"])
        mlm, nsp = torch.func.functional_call(net, weights, inputs)
        loss = torch.nn.functional.cross_entropy(
            mlm.flatten(0, 1).float(), cuda["labels"].gather(1, cuda["masked_positions"]).flatten()
        )
    assert mlm.shape == (8, SLOTS, VOCAB) and mlm.device.type == "cuda" and mlm.dtype == torch.bfloat16
    # The decoder's GEMM writes rows padded to a multiple of 64 (16-byte aligned in bf16); the logits are a view.
    rows = weights["bert.embeddings.word_embeddings.weight"].shape[0]
    assert rows % 64 == 0 and rows > VOCAB and mlm.stride(-2) == rows
    assert nsp is None and loss.shape == () and loss.device.type == "cuda"

"""Packed pre-training batches (task.datamodule.packing=true): every example's MLM and NSP losses in a packed batch
equal the same example's run alone, and the packed step compiles to one graph with no break or recompile."""

from __future__ import annotations

import json
import random

import pytest
import torch
import torch.nn.functional as F
from helpers.runs import TINY_PRETRAIN, run_train_forked, write_bert_corpus

from lightbert.data.encoding import IGNORE_INDEX
from lightbert.model import BertConfig, BertForPreTraining, PackedRows
from lightbert.tasks.pretraining.masking import MaskingCollator
from lightbert.tasks.pretraining.module import PreTrainingModule
from lightbert.tasks.pretraining.packing import PackingCollator, packed_rows

VOCAB, WIDTH = 120, 64
CONFIG = BertConfig(
    vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
    max_position_embeddings=WIDTH,
)  # fmt: skip


def sentence_pairs(count: int, seed: int = 0) -> list[dict]:
    """[CLS] A [SEP] B [SEP] examples of 6-60 tokens (ids 5.. are words; 1 [CLS], 2 [SEP]), each with its mask seed."""
    rng = random.Random(seed)
    examples = []
    for i in range(count):
        a, b = rng.randint(2, 30), rng.randint(1, 27)
        ids = [1, *(rng.randrange(5, VOCAB) for _ in range(a)), 2, *(rng.randrange(5, VOCAB) for _ in range(b)), 2]
        types = [0] * (a + 2) + [1] * (b + 1)
        examples.append(
            {"input_ids": ids, "token_type_ids": types, "next_sentence_label": rng.randint(0, 1), "mask_seed": 1000 + i}
        )
    return examples


def masking() -> MaskingCollator:
    return MaskingCollator(vocab_size=VOCAB, pad_id=0, mask_id=3, special_ids=[0, 1, 2, 3, 4])


def model() -> BertForPreTraining:
    torch.manual_seed(0)
    return BertForPreTraining(CONFIG).eval()  # fp32, no dropout: the numbers must match to 1e-5


def losses_alone(net: BertForPreTraining, example: dict) -> tuple[dict[int, float], float]:
    """{position in the example: MLM loss} and the NSP loss of `example` run alone."""
    batch = masking()([example])
    predicted = batch["labels"] != IGNORE_INDEX
    with torch.no_grad():
        mlm, nsp = net(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], predicted)
    tokens = F.cross_entropy(mlm, batch["labels"][predicted], reduction="none")
    positions = predicted[0].nonzero().squeeze(1).tolist()
    return dict(zip(positions, tokens.tolist(), strict=True)), float(F.cross_entropy(nsp, batch["next_sentence_label"]))


@pytest.mark.parametrize("unpad", ["groups", "varlen"])
def test_every_example_in_a_packed_batch_has_the_losses_it_has_alone(unpad):
    """Attention within each example: a (T, T) document mask ("groups", or "off": packed rows have no padding to
    skip), or variable-length attention over the flattened rows ("varlen", here its CPU path)."""
    examples = sentence_pairs(24)
    packed = PackingCollator(masking(), WIDTH, max_examples_per_row=4)(examples)
    rows = packed["input_ids"].shape[0]
    assert packed["input_ids"].shape[1] == WIDTH and rows < len(examples)  # several examples per row
    assert (packed["example_index"] >= 0).sum() == len(examples)
    assert packed["attention_mask"].float().mean() > 0.8  # almost no padding (plain: about half the batch)

    net = model()
    net.bert.set_unpadding(unpad)
    with torch.no_grad():
        mlm, nsp = net(
            packed["input_ids"], packed["token_type_ids"], packed["attention_mask"], packed["masked_positions"],
            packed=packed_rows(packed),
        )  # fmt: skip
    assert mlm.shape[:2] == packed["masked_positions"].shape and nsp.shape == (rows, 4, 2)
    labels = packed["labels"].gather(1, packed["masked_positions"])
    token_losses = F.cross_entropy(mlm.flatten(0, 1), labels.flatten(), reduction="none").view_as(labels)
    documents = packed["document_ids"].gather(1, packed["masked_positions"])
    positions = packed["position_ids"].gather(1, packed["masked_positions"])
    packed_mlm: dict[int, dict[int, float]] = {}
    for r, p in (labels != IGNORE_INDEX).nonzero().tolist():
        example = int(packed["example_index"][r, documents[r, p] - 1])
        packed_mlm.setdefault(example, {})[int(positions[r, p])] = float(token_losses[r, p])
    for i, example in enumerate(examples):
        mlm_alone, nsp_alone = losses_alone(net, example)
        assert packed_mlm[i].keys() == mlm_alone.keys(), i  # the same positions masked
        for position, loss in mlm_alone.items():
            assert abs(packed_mlm[i][position] - loss) < 1e-5, (i, position)
        r, slot = (packed["example_index"] == i).nonzero()[0].tolist()
        nsp_packed = F.cross_entropy(nsp[r, slot][None], packed["next_sentence_label"][r, slot][None])
        assert abs(float(nsp_packed) - nsp_alone) < 1e-5, i


def test_the_packed_batch_loss_is_the_plain_batch_loss():
    """The module's loss means over predicted tokens and over examples, packed or not."""
    examples = sentence_pairs(16, seed=1)
    module = PreTrainingModule(CONFIG.to_dict(), {"lr": 1e-4, "warmup_ratio": 0.01})
    module.model.load_state_dict(model().state_dict())
    module.eval()
    with torch.no_grad():
        plain = module._step(masking()(examples))
        packed = module._step(PackingCollator(masking(), WIDTH)(examples))
    for name in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "num_predictions"):
        assert abs(float(plain[name]) - float(packed[name])) < 1e-5, name


def test_the_packed_step_compiles_to_one_graph_without_breaks_or_recompiles():
    """Forward and backward of the training step on batches of different row counts: one graph for the model and
    one for the losses (`compile_step`), no break, no recompile (the row count is dynamic, everything else
    fixed). aot_eager: the graph is Dynamo's whatever the backend, and Inductor's C++ compile would take minutes
    here."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    module = PreTrainingModule(CONFIG.to_dict(), {"lr": 1e-4, "warmup_ratio": 0.01})
    module.compile_step(backend="aot_eager")
    collate = PackingCollator(masking(), WIDTH)
    row_counts = set()
    for seed, count in enumerate((16, 24, 9, 30)):
        batch = collate(sentence_pairs(count, seed=seed))
        row_counts.add(batch["input_ids"].shape[0])
        module._step(batch)["loss"].backward()
    assert len(row_counts) > 1
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 2
    torch._dynamo.reset()


def test_packing_through_the_command_line(tmp_path):
    corpus = write_bert_corpus(tmp_path / "corpus.txt")
    run_dir = tmp_path / "run"
    result = run_train_forked(
        *TINY_PRETRAIN, f"corpus.paths=[{corpus}]", "task.datamodule.packing=true", "trainer.max_steps=4",
        "trainer.val_check_interval=4", f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["global_step"] == 4 and 0 < results["metrics"]["val/nsp_accuracy"] <= 1


def test_packing_refuses_the_left_to_right_objective(tmp_path, corpus_file):
    from lightbert.errors import ConfigError
    from lightbert.tasks.pretraining.corpus import TextCorpus
    from lightbert.tasks.pretraining.datamodule import PretrainDataModule

    with pytest.raises(ConfigError, match="packing=true packs examples for a bidirectional encoder"):
        PretrainDataModule(TextCorpus([str(corpus_file)]), cache_dir=str(tmp_path), objective="ltr", packing=True)


def test_packed_rows_are_what_the_model_reads():
    batch = PackingCollator(masking(), WIDTH)(sentence_pairs(5))
    rows = packed_rows(batch)
    assert isinstance(rows, PackedRows) and rows.document_ids is batch["document_ids"]
    assert packed_rows({"input_ids": batch["input_ids"]}) is None

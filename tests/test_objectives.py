"""The pre-training objectives of the paper's Table 5: mlm_nsp (BERT), mlm (No NSP) and ltr (LTR & No NSP)."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from helpers.models import random_batch
from helpers.runs import TINY_PRETRAIN, compose_config, write_bert_corpus

from lightbert import train
from lightbert.checkpoints.reading import load_pretrained
from lightbert.data.encoding import IGNORE_INDEX
from lightbert.errors import ConfigError
from lightbert.model import BertConfig, BertModel
from lightbert.model.layouts import Padded, attention_mask_for, explicit_attention_mask, length_groups
from lightbert.tasks.pretraining.masking import NextTokenCollator
from lightbert.tasks.pretraining.module import PreTrainingModule

TINY = {
    "vocab_size": 120,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
OPTIM = {"lr": 1e-3, "warmup_ratio": 0.0}


@pytest.mark.parametrize("unpad", ["groups", "varlen", "off"])
def test_the_left_to_right_encoder_never_looks_right(unpad):
    torch.manual_seed(0)
    model = BertModel(BertConfig.from_dict({**TINY, "attention": "left_to_right"})).eval()
    model.set_unpadding(unpad)
    input_ids, token_type_ids, attention_mask = random_batch(vocab=120)
    with torch.no_grad():
        before, _, _ = model(input_ids, token_type_ids, attention_mask)
        for position in (3, 6, 12):  # change every token from `position` on: earlier outputs stay
            changed = input_ids.clone()
            changed[:, position:] = torch.randint(5, 120, changed[:, position:].shape)
            after, _, _ = model(changed, token_type_ids, attention_mask)
            torch.testing.assert_close(after[:, :position], before[:, :position], atol=1e-6, rtol=0)
            assert not torch.allclose(after[0, position:], before[0, position:])
        # The same weights attending both ways see the right context: the direction is a property of the call.
        both_ways, _, _ = model(changed, token_type_ids, attention_mask, causal=False)
        assert not torch.allclose(both_ways[:, :3], after[:, :3])


@pytest.mark.parametrize("unpad", ["groups", "varlen", "off"])
def test_left_to_right_over_a_padded_batch_equals_each_sequence_alone(unpad):
    """Right-padded batches attend with the kernel's causal mask only (no (T, T) mask, length groups on): every real
    token's output equals the one of its sequence run alone, unpadded, under an explicit lower-triangular mask."""
    torch.manual_seed(0)
    model = BertModel(BertConfig.from_dict({**TINY, "attention": "left_to_right"})).eval()
    model.set_unpadding(unpad)
    input_ids = torch.randint(5, 120, (8, 24))
    lengths = [24, 3, 17, 9, 24, 5, 12, 20]  # mixed enough that unpadding attends in length groups
    attention_mask = (torch.arange(24)[None] < torch.tensor(lengths)[:, None]).long()
    assert unpad != "groups" or length_groups(attention_mask) is not None
    with torch.no_grad():
        batched, pooled, _ = model(input_ids, None, attention_mask)
        for row, n in enumerate(lengths):
            ids = input_ids[row : row + 1, :n]
            alone = ids.new_ones(1, n)
            mask = explicit_attention_mask(alone, n, causal=True, device=ids.device)
            x = model.embeddings(ids)
            for layer in model.encoder.layer:
                x = layer(x, Padded(mask))
            torch.testing.assert_close(batched[row, :n], x[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(pooled[row], model.pooler(x, torch.tensor([n - 1]))[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("unpad", ["groups", "varlen"])
def test_a_mask_that_is_not_padding_at_the_end_falls_back_to_the_full_mask(unpad):
    """Left padding or a hole breaks the causal-kernel shortcut; the full mask keeps the hidden token unseen (varlen
    never needs it: each sequence's real tokens, in order, attend left to right)."""
    torch.manual_seed(0)
    model = BertModel(BertConfig.from_dict({**TINY, "attention": "left_to_right"})).eval()
    model.set_unpadding(unpad)
    input_ids = torch.randint(5, 120, (2, 12))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, 4] = 0  # a hole
    attention_mask[1, :3] = 0  # left padding
    assert attention_mask_for(attention_mask, causal=True)[1] is False
    with torch.no_grad():
        before, _, _ = model(input_ids, None, attention_mask)
        changed = input_ids.clone()
        changed[0, 4], changed[1, :3] = 7, 9
        after, _, _ = model(changed, None, attention_mask)
    real = attention_mask.bool()
    torch.testing.assert_close(after[real], before[real], atol=1e-6, rtol=0)


def test_the_ltr_loss_equals_predicting_each_next_token_from_its_prefix_alone():
    """The loss of a batch equals, by hand, the mean over every real position t but the last of the cross-entropy of
    token t + 1 given the prefix 0..t run alone (no mask needed: nothing lies to its right)."""
    torch.manual_seed(0)
    module = PreTrainingModule(dict(TINY), OPTIM, objective="ltr").eval()
    assert module.config.attention == "left_to_right"
    rng = random.Random(0)
    rows = [
        {
            "input_ids": [2, *(rng.randint(5, 119) for _ in range(n)), 3],
            "token_type_ids": [0] * (n + 2),
            "next_sentence_label": 0,
        }
        for n in (9, 4, 13)
    ]
    batch = NextTokenCollator(pad_id=0, pad_to_multiple_of=8)(rows)
    with torch.no_grad():
        loss = module._step(batch)["loss"]
        losses = []
        for row in rows:
            ids = torch.tensor([row["input_ids"]])
            for t in range(ids.shape[1] - 1):
                sequence_output, _, _ = module.model.bert(ids[:, : t + 1], causal=False)
                logits = module.model.cls.predictions(sequence_output[0, t])
                losses.append(F.cross_entropy(logits[None], ids[0, t + 1 : t + 2]))
    assert loss.item() == pytest.approx(torch.stack(losses).mean().item(), abs=1e-5)
    labels = batch["labels"]
    assert (labels != IGNORE_INDEX).sum().item() == sum(len(r["input_ids"]) - 1 for r in rows)


def test_mlm_alone_has_no_nsp_parameters_and_no_nsp_loss():
    module = PreTrainingModule(dict(TINY), OPTIM, objective="mlm")
    names = list(module.model.state_dict())
    assert not [n for n in names if "seq_relationship" in n or "pooler" in n]
    input_ids, token_type_ids, attention_mask = random_batch(vocab=120)
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[:, 2] = input_ids[:, 2]
    batch = {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask,
        "labels": labels,
        "next_sentence_label": torch.zeros(3, dtype=torch.long),
    }
    out = module._step(batch)
    assert "nsp_loss" not in out and out["loss"] == out["mlm_loss"]
    assert set(module.val_sums) == {"mlm_loss", "mlm_accuracy"}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("task.objective=nsp_only", "task.objective='nsp_only' is not known"),
        ("task.datamodule.masking.same=0.3", "task.datamodule.masking must be three shares"),
        ("task.datamodule.examples=sentences", "task.datamodule.examples='sentences' is not known"),
        # NSP (task=pretrain's objective) asked of chunks, which have no sentence pairs: for the run, or in a phase.
        ("task.datamodule.examples=chunks", "^task.datamodule.examples=chunks has no sentence pairs, and "
         "task.objective=mlm_nsp asks for next sentence prediction: set task.objective=mlm"),
        ("task.phases=[{until: 0.5, datamodule: {}}, {until: 1.0, datamodule: {examples: chunks}}]",
         "^task.phases\\[1\\] sets {'examples': 'chunks', 'objective': 'mlm_nsp'}: task.datamodule.examples=chunks "
         "has no sentence pairs"),
    ],
)  # fmt: skip
def test_an_unknown_objective_bad_masking_or_nsp_of_chunks_is_refused_before_anything_is_written(
    override, message, corpus_file, tmp_path
):
    overrides = [*TINY_PRETRAIN, f"corpus.paths=[{corpus_file}]", "trainer.max_steps=4", override]
    with pytest.raises(ConfigError, match=message) as error:
        train(compose_config(overrides, tmp_path / "run"))
    assert "\n" not in str(error.value)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


@pytest.fixture(scope="module")
def objective_runs(tmp_path_factory):
    """A few steps of pre-training with each objective, on one small corpus."""
    root = tmp_path_factory.mktemp("objectives")
    corpus = write_bert_corpus(root / "corpus.txt")
    runs = {}
    for objective in ("mlm_nsp", "mlm", "ltr"):
        overrides = [
            *TINY_PRETRAIN,
            f"corpus.paths=[{corpus}]",
            f"task.objective={objective}",
            "trainer.max_steps=4",
            "trainer.val_check_interval=2",
        ]
        results = train(compose_config(overrides, root / objective))
        runs[objective] = (root / objective, results)
    return runs


def fine_tune_sst2(run_dir, tmp_path, *extra: str) -> dict:
    """A short SST-2 fine-tune of a pre-trained run, in tmp_path/sst2."""
    from helpers.glue_files import glue_data_files

    files = glue_data_files(tmp_path / "data", "sst2")
    overrides = [
        "task=glue/sst2",
        f"init_from={run_dir}",
        "trainer=cpu",
        "logger=csv",
        "task.batch_size=8",
        "task.max_seq_length=32",
        "trainer.max_epochs=1",
        *extra,
        *(f"task.data_files.{k}={v}" for k, v in files.items()),
    ]
    return train(compose_config(overrides, tmp_path / "sst2"))


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["mlm_nsp", "mlm", "ltr"])
def test_every_objective_pre_trains_and_its_checkpoint_fine_tunes(objective, objective_runs, tmp_path):
    run_dir, results = objective_runs[objective]
    logged = set(results["metrics"])
    assert ("val/nsp_loss" in logged) == (objective == "mlm_nsp") and "val/mlm_loss" in logged
    assert load_pretrained(str(run_dir)).config["attention"] == (
        "left_to_right" if objective == "ltr" else "bidirectional"
    )
    fine_tuned = fine_tune_sst2(run_dir, tmp_path)
    assert "val/accuracy" in fine_tuned["metrics"]
    # The fine-tuned classifier attends as it was pre-trained to.
    assert (
        load_pretrained(str(tmp_path / "sst2")).config["attention"] == load_pretrained(str(run_dir)).config["attention"]
    )


@pytest.mark.parametrize(("objective", "hf_class"), [("mlm", "BertForMaskedLM"), ("ltr", "BertLMHeadModel")])
def test_mlm_and_ltr_checkpoints_convert_to_their_hugging_face_classes(objective, hf_class, objective_runs, tmp_path):
    import transformers

    from lightbert.interop.convert import main as convert

    run_dir, _ = objective_runs[objective]
    assert convert(["to-hf", str(run_dir), str(tmp_path / "hf")]) == 0
    hf = getattr(transformers, hf_class).from_pretrained(tmp_path / "hf").eval()
    ours = PreTrainingModule.load_from_checkpoint(
        load_pretrained(str(run_dir)).source, weights_only=True, sparse_mlm_head=False
    ).model.eval()
    input_ids, token_type_ids, attention_mask = random_batch(vocab=ours.config.vocab_size)
    with torch.no_grad():
        logits, nsp = ours(input_ids, token_type_ids, attention_mask)
        theirs = hf(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask).logits
    real = attention_mask.bool()
    assert nsp is None
    torch.testing.assert_close(logits[real], theirs[real], atol=1e-4, rtol=0)


def test_the_bilstm_on_top_reads_real_tokens_only():
    """Table 5's + BiLSTM: a sequence's outputs do not depend on how much padding its batch has."""
    from lightbert.model import BertForQuestionAnswering, BertForSequenceClassification

    config = BertConfig.from_dict({**TINY, "attention": "left_to_right"})
    torch.manual_seed(0)
    for model in (BertForSequenceClassification(config, 2, bilstm=True), BertForQuestionAnswering(config, bilstm=True)):
        model.eval()
        input_ids, token_type_ids, attention_mask = random_batch(vocab=120)
        padded = [
            torch.cat([t, torch.zeros_like(t[:, :5])], dim=1) for t in (input_ids, token_type_ids, attention_mask)
        ]
        with torch.no_grad():
            short, long = model(input_ids, token_type_ids, attention_mask), model(*padded)
        if isinstance(short, tuple):  # question answering: start and end logits, at the real tokens
            real = attention_mask.bool()
            for a, b in zip(short, long, strict=True):
                torch.testing.assert_close(a[real], b[:, :20][real], atol=1e-5, rtol=0)
        else:
            torch.testing.assert_close(short, long, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_a_left_to_right_checkpoint_fine_tunes_with_a_bilstm_on_top(objective_runs, tmp_path):
    from lightbert.tasks.finetuned import load_finetuned

    run_dir, _ = objective_runs["ltr"]
    results = fine_tune_sst2(run_dir, tmp_path, "task.module.bilstm=true")
    assert "val/accuracy" in results["metrics"]
    finetuned = load_finetuned(str(tmp_path / "sst2"))  # predict.py builds it back, BiLSTM and all
    assert finetuned.bilstm and finetuned.model.bilstm is not None

"""The feature-based approach: frozen means frozen, each layer combination, the Table 7 sweep summary, and
extracted features equal to transformers' hidden states."""

from __future__ import annotations

import json
import subprocess

import lightning as L
import pytest
import torch
import transformers
from helpers import runtime
from helpers.models import extract_config, write_hf_bert
from helpers.ner_files import ner_data_files, read_conlleval
from helpers.runs import REPO, run_train_forked
from omegaconf import OmegaConf

from lightbert.checkpoints.reading import load_into, load_pretrained
from lightbert.errors import ConfigError, UserError
from lightbert.inference.embeddings import extract_to_file
from lightbert.inference.predict import predict_records
from lightbert.model import BertConfig
from lightbert.model.feature_based import FeatureBasedTagger, layer_combinations
from lightbert.tasks.finetuned import load_finetuned
from lightbert.tasks.ner.data import CONLL2003_LABELS, ConllDataModule
from lightbert.tasks.ner.module import TokenClassificationModule


def tagger(bert_dir, features: str) -> FeatureBasedTagger:
    pretrained = load_pretrained(str(bert_dir))
    model = FeatureBasedTagger(BertConfig.from_dict(pretrained.config), 9, features, lstm_hidden_size=16)
    load_into(model, pretrained)
    return model


@pytest.mark.parametrize("features", list(layer_combinations(4)))
def test_each_layer_combination_reads_the_hidden_states_it_names(bert4, features):
    model = tagger(bert4, features).train()
    assert not model.bert.training  # fixed features: no encoder dropout even in training mode
    input_ids = torch.randint(5, 60, (2, 9))
    mask = torch.ones_like(input_ids)
    mask[1, 6:] = 0
    types = torch.zeros_like(input_ids)
    with torch.no_grad():
        _, _, hidden = model.bert(input_ids, types, mask, output_hidden_states=True)
        got = model.combined_layers(input_ids, types, mask)
    expected = {
        "embeddings": hidden[0],
        "second_to_last": hidden[-2],
        "last": hidden[-1],
        "sum_last_four": torch.stack(hidden[-4:]).mean(0),  # equal weights before training
        "concat_last_four": torch.cat(hidden[-4:], dim=-1),
        "sum_all": torch.stack(hidden[1:]).mean(0),
    }[features]
    torch.testing.assert_close(got, expected)
    logits = model(input_ids, types, mask)
    assert logits.shape == (2, 9, 9)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and not any(n.startswith("bert.") for n in trainable)
    assert any(n.startswith("mix.") for n in trainable) == features.startswith("sum_")


def test_unknown_combination_and_too_few_layers_are_named(bert4):
    with pytest.raises(ConfigError, match=r"task.features='last4' is not known; valid: \['embeddings'"):
        tagger(bert4, "last4")
    config = BertConfig.from_dict({**load_pretrained(str(bert4)).config, "num_hidden_layers": 2})
    with pytest.raises(ConfigError, match="needs 4 layers; the model has 2"):
        FeatureBasedTagger(config, 9, "concat_last_four")


class EncoderModes(L.Callback):
    """Records, at every training step, whether the encoder was in training mode (dropout on)."""

    def __init__(self):
        self.modes = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.modes.append(module.model.bert.training)


def test_frozen_means_frozen(tmp_path, bert4):
    """Feature-based training changes the BiLSTM, the layer weights and the classifier, and no encoder weight."""
    files = ner_data_files(tmp_path / "data", sizes=(32, 8, 8))
    pretrained = load_pretrained(str(bert4))
    module = TokenClassificationModule(
        pretrained.config, {"lr": 1e-2, "warmup_ratio": 0.0}, CONLL2003_LABELS, "sum_last_four", 16, 2
    )
    load_into(module.model, pretrained)
    before = {k: v.clone() for k, v in module.model.state_dict().items()}
    datamodule = ConllDataModule(
        cache_dir=str(tmp_path / "cache"),
        tokenizer=pretrained.tokenizer,
        data_files={k: str(v) for k, v in files.items()},
        batch_size=8,
    )
    modes = EncoderModes()
    trainer = L.Trainer(
        max_steps=6, logger=False, enable_checkpointing=False, enable_progress_bar=False, callbacks=[modes]
    )
    trainer.fit(module, datamodule=datamodule)
    after = module.model.state_dict()
    encoder = [k for k in before if k.startswith("bert.")]
    assert encoder and all(torch.equal(before[k], after[k]) for k in encoder)  # bit for bit
    changed = {k.split(".")[0] for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"mix", "lstm", "classifier"}
    assert modes.modes == [False] * 6  # and no dropout in the encoder at any step
    optimised = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    assert not optimised & {id(p) for p in module.model.bert.parameters()}


@pytest.mark.slow
def test_feature_sweep_summary_has_table_7_s_shape(tmp_path, bert4):
    files = ner_data_files(tmp_path / "data", sizes=(24, 8, 8))
    result = run_train_forked(
        "task=conll2003_features",
        f"init_from={bert4}",
        "sweep=feature_layers",
        "task.features=last,embeddings,concat_last_four",  # three of Table 7's rows, out of order
        "task.lstm_hidden_size=16",
        "trainer.max_steps=2",
        "logger=csv",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        *(f"task.data_files.{k}={v}" for k, v in files.items()),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "in eval mode at the start of training" not in result.stderr  # the frozen encoder is eval on purpose
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    table = summary.split("## Feature-based approach (paper Table 7)")[1].strip().splitlines()
    assert table[0] == "| Layers | task.features | val/f1 |"
    rows = [line.split(" | ")[0].strip("| ") for line in table[2:]]
    assert rows == ["Embeddings", "Last Hidden", "Concat Last Four Hidden"]  # the paper's order
    best = {}
    for job in (tmp_path / "sweep").glob("[0-9]*"):
        features = OmegaConf.load(job / ".hydra" / "config.yaml").task.features
        best[features] = json.loads((job / "results.json").read_text())["best_score"]
    for line in table[2:]:
        _, name, value = (c.strip() for c in line.strip("|").split("|"))
        assert float(value) == pytest.approx(best[name], abs=1e-4)
    # A feature-based run predicts new text with predict.py as its own evaluation tagged the dev set.
    job = next(j for j in (tmp_path / "sweep").glob("[0-9]*") if (j / "predictions" / "validation.txt").is_file())
    sentences = read_conlleval(job / "predictions" / "validation.txt")
    finetuned = load_finetuned(str(job))
    assert finetuned.feature_based is not None
    records = [(n, {"words": [w for w, _, _ in s]}) for n, s in enumerate(sentences, start=1)]
    predicted = predict_records(finetuned, records, batch_size=3)[0].predictions
    assert [p["tags"] for p in predicted] == [[tag for _, _, tag in s] for s in sentences]


# -- feature extraction ---------------------------------------------------------------------------------------


LINES = ["the city river team", "the war was new ||| his album is called music", "", "school " * 80]


def test_extracted_features_equal_transformers_hidden_states(tmp_path):
    bert = write_hf_bert(tmp_path / "bert", num_hidden_layers=3, bare_encoder=True)
    (tmp_path / "in.txt").write_text("\n".join(LINES) + "\n")
    out = tmp_path / "out.jsonl"
    result = subprocess.run(
        [
            runtime.python(),
            str(REPO / "src" / "extract_features.py"),
            f"init_from={bert}",
            f"input_file={tmp_path / 'in.txt'}",
            "layers=[-1,-2,-3,0]",
            f"output_file={out}",
            "max_seq_length=64",
            "batch_size=3",  # a second batch, padded differently
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "wrote the features of 4 line(s)" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert", "in.txt", "out.jsonl"]  # nothing else written
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["linex_index"] for r in records] == [0, 1, 2, 3]

    reference = transformers.BertModel.from_pretrained(bert).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(bert)  # a BERT tokenizer from vocab.txt
    for line, record in zip(LINES, records, strict=True):
        a, _, b = line.partition(" ||| ")
        encoded = tokenizer(a, b or None, truncation="longest_first", max_length=64, return_tensors="pt")
        with torch.no_grad():
            hidden = reference(**encoded, output_hidden_states=True).hidden_states[1:]  # the encoder layers
        tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
        assert [f["token"] for f in record["features"]] == tokens
        for position, feature in enumerate(record["features"]):
            assert [layer["index"] for layer in feature["layers"]] == [-1, -2, -3, 0]
            for layer in feature["layers"]:
                expected = hidden[layer["index"]][0, position]
                torch.testing.assert_close(torch.tensor(layer["values"]), expected, atol=2e-5, rtol=0)
    assert len(records[3]["features"]) == 64  # cut to max_seq_length


def test_feature_extraction_errors_are_named(tmp_path, bert4):
    cfg = extract_config(bert4, tmp_path, [-5])
    with pytest.raises(UserError, match="from -4 to 3"):
        extract_to_file(cfg)
    cfg.layers = [-1]
    assert extract_to_file(cfg)[1] == 1
    saved = (tmp_path / "out.jsonl").read_text()
    with pytest.raises(UserError, match="exists; choose another name or pass overwrite=true"):
        extract_to_file(cfg)
    assert (tmp_path / "out.jsonl").read_text() == saved  # never overwritten
    cfg.input_file, cfg.output_file = str(tmp_path / "missing.txt"), str(tmp_path / "other.jsonl")
    with pytest.raises(UserError, match="missing.txt does not exist"):
        extract_to_file(cfg)

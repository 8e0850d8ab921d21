"""Checkpoints in and out: Hugging Face directories <-> lightbert, with equal numerics both ways."""

import json
import os

import pytest
import torch
import transformers
from helpers.models import random_batch, write_hf_bert
from helpers.runs import compose_config

from lightbert import train
from lightbert.checkpoints.reading import load_into, load_pretrained
from lightbert.errors import ConfigError, UserError
from lightbert.interop.convert import main as convert
from lightbert.model import BertConfig, BertForPreTraining
from lightbert.tasks.pretraining.module import PreTrainingModule

ATOL = 1e-5


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return write_hf_bert(tmp_path_factory.mktemp("hf") / "bert")


def lightbert_from(directory) -> BertForPreTraining:
    pretrained = load_pretrained(str(directory))
    model = BertForPreTraining(BertConfig.from_dict(pretrained.config))
    assert load_into(model, pretrained) == []  # every weight came from the checkpoint
    return model.eval()


def assert_same_outputs(ours: BertForPreTraining, hf: transformers.BertForPreTraining, vocab: int) -> None:
    input_ids, token_type_ids, attention_mask = random_batch(vocab=vocab)
    with torch.no_grad():
        mlm, nsp = ours(input_ids, token_type_ids, attention_mask)
        _, _, hidden = ours.bert(input_ids, token_type_ids, attention_mask, output_hidden_states=True)
        ref = hf(
            input_ids=input_ids,
            token_type_ids=token_type_ids,
            attention_mask=attention_mask,
            output_hidden_states=True,
        )
    real = attention_mask.bool()  # padded positions are free to differ
    torch.testing.assert_close(mlm[real], ref.prediction_logits[real], atol=ATOL, rtol=0)
    torch.testing.assert_close(nsp, ref.seq_relationship_logits, atol=ATOL, rtol=0)
    assert len(hidden) == len(ref.hidden_states)
    for layer, (h, r) in enumerate(zip(hidden, ref.hidden_states, strict=True)):
        torch.testing.assert_close(h[real], r[real], atol=ATOL, rtol=0, msg=f"hidden state {layer}")


def test_hugging_face_directory_loads_with_equal_outputs(hf_dir):
    hf = transformers.BertForPreTraining.from_pretrained(hf_dir).eval()
    ours = lightbert_from(hf_dir)
    assert_same_outputs(ours, hf, ours.config.vocab_size)


def test_attention_maps_equal_hugging_face_output_attentions(hf_dir):
    hf = transformers.BertModel.from_pretrained(hf_dir, attn_implementation="eager").eval()
    ours = lightbert_from(hf_dir).bert
    input_ids, token_type_ids, attention_mask = random_batch(vocab=ours.config.vocab_size)
    with torch.no_grad():
        ref = hf(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask, output_attentions=True
        )
    maps = ours.attentions(input_ids, token_type_ids, attention_mask)
    assert len(maps) == len(ref.attentions) == ours.config.num_hidden_layers
    real = attention_mask.bool()  # rows of real query tokens; padded keys get 0 in both
    for got, expected in zip(maps, ref.attentions, strict=True):
        torch.testing.assert_close(got.transpose(1, 2)[real], expected.transpose(1, 2)[real], atol=1e-6, rtol=0)
        torch.testing.assert_close(got.sum(-1), torch.ones_like(got.sum(-1)))


def test_hugging_face_tokenizer_comes_with_the_checkpoint(hf_dir):
    pretrained = load_pretrained(str(hf_dir))
    reference = transformers.AutoTokenizer.from_pretrained(hf_dir)  # a BERT tokenizer from vocab.txt
    text = "The film was GREAT, the river city team"
    assert pretrained.tokenizer.encode_batch([text])[0] == reference(text, add_special_tokens=False)["input_ids"]


def test_bare_encoder_checkpoint_loads_and_leaves_heads_fresh(tmp_path):
    directory = write_hf_bert(tmp_path / "encoder", bare_encoder=True)
    pretrained = load_pretrained(str(directory))
    model = BertForPreTraining(BertConfig.from_dict(pretrained.config))
    fresh = load_into(model, pretrained)
    assert fresh and all(name.startswith("cls.") for name in fresh)
    hf = transformers.BertModel.from_pretrained(directory).eval()
    input_ids, token_type_ids, attention_mask = random_batch(vocab=model.config.vocab_size)
    with torch.no_grad():
        ours = model.eval().bert(input_ids, token_type_ids, attention_mask)[0]
        ref = hf(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask).last_hidden_state
    real = attention_mask.bool()
    torch.testing.assert_close(ours[real], ref[real], atol=ATOL, rtol=0)


@pytest.fixture(scope="module")
def pretraining_run(tmp_path_factory):
    """A real lightbert pre-training run (the command-line pipeline) of a few steps: its directory."""
    root = tmp_path_factory.mktemp("pretrain")
    from helpers.runs import write_bert_corpus

    corpus = write_bert_corpus(root / "corpus.txt")
    cfg = compose_config(
        [
            "model=bert_tiny",
            "trainer=cpu",
            "logger=csv",
            "corpus=text",
            f"corpus.paths=[{corpus}]",
            "task.batch_size=8",
            "task.max_seq_length=64",
            "task.datamodule.num_workers=0",
            "task.datamodule.vocab_size=400",
            "trainer.max_steps=4",
            "trainer.val_check_interval=2",
        ],
        root / "run",
    )
    train(cfg)
    return root / "run"


def test_exported_pretraining_checkpoint_gives_transformers_the_same_logits(pretraining_run, tmp_path):
    out = tmp_path / "exported"
    assert convert(["to-hf", str(pretraining_run), str(out)]) == 0
    assert {"config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    hf = transformers.BertForPreTraining.from_pretrained(out).eval()
    results = json.loads((pretraining_run / "results.json").read_text())
    ours = PreTrainingModule.load_from_checkpoint(results["best_checkpoint"], weights_only=True).model.eval()
    assert_same_outputs(ours, hf, ours.config.vocab_size)
    # The exported tokenizer is the run's: transformers encodes text to the same ids.
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    text = "The album was called the new river."
    ours_ids = load_pretrained(str(pretraining_run)).tokenizer.encode_batch([text])[0]
    assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] == ours_ids


def test_imported_checkpoint_loads_as_a_lightbert_module(hf_dir, tmp_path):
    out = tmp_path / "imported"
    assert convert(["from-hf", str(hf_dir), str(out)]) == 0
    module = PreTrainingModule.load_from_checkpoint(out / "model.ckpt", weights_only=True)
    hf = transformers.BertForPreTraining.from_pretrained(hf_dir).eval()
    assert_same_outputs(module.model.eval(), hf, module.config.vocab_size)
    assert (out / "tokenizer.json").is_file()
    # ... and back: exporting the import reproduces the original outputs.
    assert convert(["to-hf", str(out / "model.ckpt"), str(tmp_path / "again")]) == 0
    assert_same_outputs(
        module.model.eval(),
        transformers.BertForPreTraining.from_pretrained(tmp_path / "again").eval(),
        module.config.vocab_size,
    )


# -- errors a user can make -----------------------------------------------------------------------------------


def test_missing_checkpoint_names_the_path(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_pretrained(str(tmp_path / "nope.ckpt"))


def test_unreadable_checkpoint_is_one_clear_error(tmp_path):
    broken = tmp_path / "broken.ckpt"
    broken.write_bytes(b"not a checkpoint at all")
    with pytest.raises(UserError, match="could not read checkpoint"):
        load_pretrained(str(broken))


def test_unreadable_hugging_face_weights_are_one_clear_error(hf_dir, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "config.json").write_text((hf_dir / "config.json").read_text())
    (copy / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(UserError, match="could not read weights"):
        load_pretrained(str(copy))


def test_directory_that_is_no_checkpoint_says_what_it_needs(tmp_path):
    with pytest.raises(UserError, match="neither config.json"):
        load_pretrained(str(tmp_path))


def test_hub_id_without_network_says_to_pass_a_directory(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="download the model elsewhere"):
        load_pretrained("someone/not-a-cached-bert")


def test_weights_that_do_not_fit_the_config_are_refused(hf_dir, tmp_path):
    copy = tmp_path / "mismatch"
    copy.mkdir()
    config = json.loads((hf_dir / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    (copy / "model.safetensors").write_bytes((hf_dir / "model.safetensors").read_bytes())
    pretrained = load_pretrained(str(copy))
    with pytest.raises(UserError, match="does not fit the model"):
        load_into(BertForPreTraining(BertConfig.from_dict(pretrained.config)), pretrained)


def test_export_never_writes_into_a_non_empty_directory(pretraining_run, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        convert(["to-hf", str(pretraining_run), str(out)])
    assert exit_info.value.code == 2
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert not list(tmp_path.glob("taken.tmp*"))


def test_model_size_other_than_the_checkpoint_is_refused(hf_dir, tmp_path):
    cfg = compose_config(["task=glue/sst2", f"init_from={hf_dir}", "model=bert_base"], tmp_path / "run")
    with pytest.raises(ConfigError, match="other sizes"):
        train(cfg)
    assert not (tmp_path / "run" / "results.json").exists()


def test_export_to_a_file_is_one_message(pretraining_run, tmp_path):
    taken = tmp_path / "model.bin"
    taken.write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        convert(["to-hf", str(pretraining_run), str(taken)])
    assert exit_info.value.code == 2 and taken.read_text() == "mine"


def test_an_exported_model_is_readable_as_any_file_the_user_writes(pretraining_run, tmp_path):
    out = tmp_path / "hf"
    assert convert(["to-hf", str(pretraining_run), str(out)]) == 0
    umask = os.umask(0)
    os.umask(umask)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask


def test_an_unreachable_hub_puts_the_hub_libraries_offline_at_once(monkeypatch, caplog):
    """No retries with back-off where the hub's host does not resolve: offline, with what is cached, said once."""
    import logging
    import socket

    import datasets.config
    import huggingface_hub.constants

    from lightbert import hub

    monkeypatch.setattr(hub, "_checked", None)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)

    def no_dns(host, port, *args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    with caplog.at_level(logging.INFO, logger="lightbert"):
        assert hub.hub_reachable() is False and hub.hub_reachable() is False
    assert huggingface_hub.constants.HF_HUB_OFFLINE and datasets.config.HF_HUB_OFFLINE
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    said = [r.getMessage() for r in caplog.records if "cannot be reached" in r.getMessage()]
    assert said == ["the Hugging Face hub (huggingface.co) cannot be reached from here: using only what is cached"]

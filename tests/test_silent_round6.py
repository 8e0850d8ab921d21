"""Issue 71's cases of "the rest" (round 6 of nothing silent): each ends OK or with one clear line naming the key to
change, before anything is written. Each test here failed on main at 1f43813."""

from __future__ import annotations

import csv

import pytest
from helpers.runs import TINY_PRETRAIN, compose_config, run_settings, run_train_forked

from lightbert.errors import ConfigError, UserError


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # Before: a ValueError traceback from OmegaConf.to_container(5).
        (["task.phases=5"], "task.phases must be a list of phases, each `until`"),
        # Before: TypeError: '<' not supported between instances of 'int' and 'str'.
        (["task=pretrain_modern", "task.phases.0.until=abc"], "task.phases[0] must have `until` (a fraction of"),
        # Before: "task.phases[1] ends at step 2, not after the previous one (2)": a key the user never wrote, no fix.
        (
            ["experiment=modern_quick_start", "trainer.max_steps=2"],
            "trainer.max_steps=2 is too few for task.phases: phase 2 (until 1.0) would end at step 2, where the one "
            "before it ended; set trainer.max_steps=5 or more",
        ),
    ],
)
def test_a_bad_phase_setting_is_one_line_naming_what_to_change(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as refused:
        run_settings(compose_config(overrides, tmp_path / "run"))
    assert message in str(refused.value)
    assert not (tmp_path / "run").exists()


def test_the_suggested_max_steps_runs_the_phases(tmp_path):
    settings = run_settings(compose_config(["experiment=modern_quick_start", "trainer.max_steps=5"], tmp_path / "r"))
    assert [(p.first_step, p.end_step) for p in settings.phases] == [(0, 4), (4, 5)]


def test_val_loss_is_the_mlm_loss_with_mlm_alone_and_the_last_line_reaches_train_log(tmp_path, corpus_file):
    """With masked LM alone, val/loss and val/mlm_loss are one number: both the mean over the split's masked tokens.
    Before, val/loss weighed each batch's mean by its sequences, and the two parted once a validation spanned batches
    of different counts (2.7690 against 2.7289). And the run's last console line ("finished ... Outputs in") is in
    train.log, as the docs say every console line is; before, it never reached it."""
    run_dir = tmp_path / "run"
    done = run_train_forked(
        *TINY_PRETRAIN,
        f"corpus.paths=[{corpus_file}]",
        "task.objective=mlm",
        "trainer.max_steps=4",
        "trainer.val_check_interval=4",
        "task.batch_size=3",  # several validation batches (of the training batch), the last one short
        "task.datamodule.validation_share=null",  # the whole held-out split
        f"hydra.run.dir={run_dir}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with (run_dir / "metrics.csv").open(newline="") as file:
        rows = [row for row in csv.DictReader(file) if row.get("val/loss")]
    assert rows, "no validation ran"
    for row in rows:
        assert float(row["val/loss"]) == pytest.approx(float(row["val/mlm_loss"]), abs=1e-6), row
    last = [line for line in done.stdout.splitlines() if line.startswith("lightbert: finished")]
    assert len(last) == 1, done.stdout[-2000:]
    assert f"[INFO] - {last[0].removeprefix('lightbert: ')}" in (run_dir / "train.log").read_text()


def test_whole_word_masking_on_a_bpe_checkpoint_is_refused_before_anything_is_written(tmp_path, corpus_file):
    """ModernBERT's byte-level BPE has no `##` pieces to mask with their word. Before, the run wrote its record,
    train.log and tokenizer, then died with a ValueError traceback from the masking collator."""
    from helpers.models import write_hf_modernbert

    modern = write_hf_modernbert(tmp_path / "hf")
    run_dir = tmp_path / "run"
    refused = run_train_forked(
        *[o for o in TINY_PRETRAIN if not o.startswith("model=")],  # init_from decides the model
        "task=pretrain_modern",
        f"init_from={modern}",
        f"corpus.paths=[{corpus_file}]",
        "trainer.max_steps=20",
        "task.datamodule.whole_word_masking=true",
        f"hydra.run.dir={run_dir}",
    )
    errors = [line for line in refused.stderr.splitlines() if line.startswith("lightbert: error:")]
    assert refused.returncode == 2 and len(errors) == 1, refused.stderr[-3000:]
    assert "task.datamodule.whole_word_masking=true" in errors[0] and "whole_word_masking=false" in errors[0]
    assert "Traceback" not in refused.stderr
    assert not run_dir.exists() or not any(run_dir.iterdir())


def test_the_continued_pretraining_page_shows_the_growth_line_the_run_prints():
    """docs/continued-pretraining.md showed a line of an older lightbert ("... and 29 padding rows (a multiple of
    64)"), which no run prints since the model pads its own rows."""
    from pathlib import Path

    from lightbert.tasks.pretraining.continued import Growth

    page = " ".join((Path(__file__).resolve().parents[1] / "docs" / "continued-pretraining.md").read_text().split())
    assert f"`{Growth(2000, 40, 2000, 2040)}`" in page
    assert f"`{Growth(2000, 40, 2048, 2048)}`" in page
    assert "a multiple of 64)`" not in page


@pytest.fixture(scope="module")
def modern_sst2(tmp_path_factory):
    """A small transformers ModernBERT (BPE tokenizer, a window of 8) and SST-2 files in GLUE's schema."""
    from helpers.glue_files import glue_data_files
    from helpers.models import write_hf_modernbert

    root = tmp_path_factory.mktemp("modern_sst2")
    return write_hf_modernbert(root / "hf"), glue_data_files(root / "data", "sst2", ext="jsonl")


@pytest.mark.parametrize("override", ["model.local_attention=64", "model.global_attn_every_n_layers=1"])
def test_an_architecture_override_init_from_does_not_have_is_refused(tmp_path, modern_sst2, override):
    """Before, `model.local_attention` and `model.global_attn_every_n_layers` were dropped without a word when
    init_from set the model: the run trained init_from's window, not the one asked for."""
    from helpers.glue_files import glue_overrides

    hf_dir, files = modern_sst2
    run_dir = tmp_path / "run"
    refused = run_train_forked(*glue_overrides("sst2", files, hf_dir), override, f"hydra.run.dir={run_dir}")
    errors = [line for line in refused.stderr.splitlines() if line.startswith("lightbert: error:")]
    assert refused.returncode == 2 and len(errors) == 1, refused.stderr[-3000:]
    key = override.split("=")[0].removeprefix("model.")
    assert f"has other sizes than {override} asks for: {key}" in errors[0] and "drop the model override" in errors[0]
    assert not run_dir.exists() or not any(run_dir.iterdir())


def test_classifier_pooling_asked_with_init_from_is_the_heads_and_said(tmp_path, modern_sst2):
    """`model.classifier_pooling=mean` on a checkpoint that pools by [CLS]: the task head pools so (as transformers'
    from_pretrained(..., classifier_pooling=...) does), and one line says so. Before, it was dropped without a word."""
    import torch
    from helpers.glue_files import glue_overrides

    hf_dir, files = modern_sst2
    run_dir = tmp_path / "run"
    done = run_train_forked(
        *glue_overrides("sst2", files, hf_dir),
        "model.classifier_pooling=mean",
        "trainer.max_epochs=1",
        f"hydra.run.dir={run_dir}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in (done.stdout + done.stderr).splitlines() if "model.classifier_pooling=mean:" in line]
    assert len(said) == 1 and "the task head pools so" in said[0], said
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["hyper_parameters"]["model"]["classifier_pooling"] == "mean"


def test_an_odd_attention_window_is_said_once(tmp_path, corpus_file):
    """transformers' ModernBERT runs an odd window (63) as the even one below it (31 tokens each side): lightbert
    does the same, and now says so in one line, instead of without a word."""
    done = run_train_forked(
        *[o for o in TINY_PRETRAIN if not o.startswith("model=")],
        "model=modernbert_tiny",
        "task=pretrain_modern",
        "task.phases=null",
        "model.local_attention=63",
        f"corpus.paths=[{corpus_file}]",
        "trainer.max_steps=1",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in (done.stdout + done.stderr).splitlines() if "model.local_attention=63 is odd" in line]
    assert len(said) == 1 and "each token sees 31 tokens on each side, a window of 62" in said[0], said


def test_a_context_shorter_than_the_window_names_the_fix_that_works(tmp_path):
    """Before: "model.local_attention (64) is larger than the context ...; lower local_attention, or set
    global_attn_every_n_layers=1", two fixes that each met the next refusal (task.max_seq_length longer than the
    context). The message now leads with the context, and its first fix runs."""
    overrides = ["model=modernbert_tiny", "task=pretrain_modern", "task.max_seq_length=128"]
    with pytest.raises(ConfigError) as refused:
        run_settings(compose_config([*overrides, "model.max_position_embeddings=32"], tmp_path / "run"))
    message = str(refused.value)
    assert message.startswith("model.max_position_embeddings (32) is shorter than model.local_attention (64)")
    assert "raise model.max_position_embeddings to at least 64 and to task.max_seq_length" in message
    run_settings(compose_config([*overrides, "model.max_position_embeddings=128"], tmp_path / "run"))  # the fix


def test_utf8_text_with_nul_padding_is_named_as_such_and_its_fix_works(tmp_path):
    """UTF-8 text followed by NUL padding (a crash or a preallocated file) was called "UTF-16 or UTF-32", with an
    iconv command that would garble the text. The one line now names the NULs, and its command gives the text back."""
    import re
    import shlex
    import subprocess

    text = "Héllo wörld, the first sentence.\nA second one.\n\nAnother document.\n"
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(text.encode() + b"\0" * 4096)
    refused = run_train_forked(*TINY_PRETRAIN, f"corpus.paths=[{corpus}]", f"hydra.run.dir={tmp_path / 'run'}")
    errors = [line for line in refused.stderr.splitlines() if line.startswith("lightbert: error:")]
    assert refused.returncode == 2 and len(errors) == 1, refused.stderr[-3000:]
    assert "runs of NUL bytes" in errors[0] and "UTF-16" not in errors[0] and "iconv" not in errors[0], errors[0]
    command = re.search(r"`(tr [^`]+)`", errors[0]).group(1)
    subprocess.run(command, shell=True, cwd=tmp_path, check=True)
    cleaned = tmp_path / shlex.split(command)[-1]
    assert cleaned.read_text(encoding="utf-8") == text


def test_convert_to_hf_of_a_modern_run_with_segments_names_the_setting_that_blocks_it(tmp_path, corpus_file, capsys):
    """A modern run with model.type_vocab_size=2: `convert to-hf` named ten settings that are ModernBERT's (as if it
    mixed BERT's blocks) instead of the one that blocks the export."""
    from lightbert.interop.convert import main as convert

    run_dir = tmp_path / "run"
    done = run_train_forked(
        *[o for o in TINY_PRETRAIN if not o.startswith("model=")],
        "model=modernbert_tiny",
        "task=pretrain_modern",
        "task.phases=null",
        "model.type_vocab_size=2",
        f"corpus.paths=[{corpus_file}]",
        "trainer.max_steps=1",
        f"hydra.run.dir={run_dir}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        convert(["to-hf", str(run_dir), str(tmp_path / "hf")])
    assert refused.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1, errors
    blocks = "is the modern encoder but for type_vocab_size=2; transformers' ModernBERT has type_vocab_size=0"
    assert blocks in errors[0]
    assert "norm_position" not in errors[0] and not (tmp_path / "hf").exists()


def test_a_validation_split_that_takes_every_streamed_document_is_named(tmp_path):
    """Streaming a corpus of 8 documents with task.datamodule.validation_documents=8: the message suggested fewer
    DataLoader workers, which cannot help. It now says the validation split took every document."""
    from helpers.runs import write_bert_corpus

    corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=8)
    refused = run_train_forked(
        *TINY_PRETRAIN,
        f"corpus.paths=[{corpus}]",
        "task.datamodule.streaming=true",
        "task.datamodule.validation_documents=8",
        "trainer.max_steps=2",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    errors = [line for line in refused.stderr.splitlines() if line.startswith("lightbert: error:")]
    assert refused.returncode == 2 and len(errors) == 1, refused.stderr[-3000:]
    assert "the validation split (task.datamodule.validation_documents=8) took every document" in errors[0]
    assert "num_workers" not in errors[0]


def test_a_run_copied_without_its_tokenizer_starts_another_with_tokenizer_path(tmp_path, corpus_file):
    """A run directory copied without tokenizer.json was refused as init_from even with
    task.datamodule.tokenizer_path given, by a message that did not say it is not read there. It now loads as its
    .ckpt alone does: refused without a tokenizer, naming task.datamodule.tokenizer_path, and run with it."""
    import shutil

    first = tmp_path / "first"
    done = run_train_forked(
        *TINY_PRETRAIN, f"corpus.paths=[{corpus_file}]", "trainer.max_steps=2", f"hydra.run.dir={first}"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    copy = tmp_path / "copy"
    shutil.copytree(first, copy, ignore=shutil.ignore_patterns("tokenizer.json"))
    again = [*TINY_PRETRAIN, f"corpus.paths=[{corpus_file}]", "trainer.max_steps=1", f"init_from={copy}"]
    refused = run_train_forked(*again, f"hydra.run.dir={tmp_path / 'refused'}")
    errors = [line for line in refused.stderr.splitlines() if line.startswith("lightbert: error:")]
    assert refused.returncode == 2 and len(errors) == 1, refused.stderr[-3000:]
    assert "comes without its tokenizer" in errors[0] and "task.datamodule.tokenizer_path=" in errors[0]
    tokenizer = first / "tokenizer.json"
    done = run_train_forked(*again, f"task.datamodule.tokenizer_path={tokenizer}", f"hydra.run.dir={tmp_path / 'ok'}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "ok" / "tokenizer.json").read_bytes() == tokenizer.read_bytes()


def test_convert_into_a_read_only_mount_point_does_not_suggest_writing_inside_it(tmp_path):
    """`convert to-hf` into an empty read-only mount point said to give "a new directory inside it", which is
    refused next. It now says the mount point cannot be written."""
    from helpers.filesystems import read_only_directory

    from lightbert.interop.hf import check_export_dir

    with read_only_directory(tmp_path / "ro") as mount, pytest.raises(UserError) as refused:
        check_export_dir(mount)
    assert "is a read-only mount point" in str(refused.value) and "inside it" not in str(refused.value)


def test_a_modern_export_tokenizes_and_classifies_as_the_run_did(tmp_path, modern_sst2):
    """Case 4: `convert to-hf` of a fine-tuned ModernBERT. transformers' AutoTokenizer on the export gives the run's
    ids with [CLS] and [SEP] (before: none, and its pipeline disagreed with predict.py on 3 of 10 labels, up to 0.52
    apart), and pipeline("text-classification") gives predict.py's labels and probabilities."""
    import transformers
    from helpers.glue_files import glue_overrides
    from helpers.predictions import predict, rows

    from lightbert.interop.convert import main as convert
    from lightbert.tasks.finetuned import load_finetuned

    hf_dir, files = modern_sst2
    run_dir, out = tmp_path / "run", tmp_path / "hf"
    done = run_train_forked(*glue_overrides("sst2", files, hf_dir), "trainer.max_epochs=1", f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert convert(["to-hf", str(run_dir), str(out)]) == 0
    records = [{"text": r["sentence"]} for r in rows(files["test"])][:10]
    texts = [r["text"] for r in records]
    tokenizer = load_finetuned(str(run_dir)).tokenizer
    ours = [[tokenizer.cls_id, *ids[:30], tokenizer.sep_id] for ids in tokenizer.encode_batch(texts)]  # 32 at most
    assert max(len(ids) for ids in tokenizer.encode_batch(texts)) > 30  # some are cut
    # The export's tokenizer cuts where the run did (its task.max_seq_length, 32): with truncation=True, as pipelines
    # are called on long texts.
    assert transformers.AutoTokenizer.from_pretrained(out)(texts, truncation=True)["input_ids"] == ours
    classify = transformers.pipeline("text-classification", model=str(out), device="cpu")
    theirs = classify(texts, top_k=None, truncation=True)
    for prediction, scores in zip(predict(run_dir, records, tmp_path), theirs, strict=True):
        assert max(scores, key=lambda s: s["score"])["label"] == prediction["label"]
        for score in scores:
            assert score["score"] == pytest.approx(prediction["probabilities"][score["label"]], abs=1e-5)


def test_a_damaged_last_checkpoint_is_named_with_the_older_one_to_resume_from(tmp_path, corpus_file):
    """Garbage inside last.ckpt: the run said "resumed from step 4", then died in torch's reader (or, with the bytes
    inside a tensor, trained on from damaged weights). It now refuses before anything is written, naming the damaged
    file and the newest whole checkpoint, whose command resumes."""
    import os
    import re
    import signal
    from pathlib import Path

    from helpers.runs import run_train_recorded, snapshot

    run_dir = tmp_path / "run"
    args = [
        *TINY_PRETRAIN,
        f"corpus.paths=[{corpus_file}]",
        "trainer.max_steps=8",
        "trainer.val_check_interval=2",  # the best checkpoint, kept beside last.ckpt
        "task.checkpoint_every_n_steps=2",
        f"hydra.run.dir={run_dir}",
    ]
    killed = run_train_recorded(
        *args, "+callbacks.kill._target_=helpers.loss_recorder.KillAtStep", "+callbacks.kill.step=5", new_session=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    last = run_dir / "checkpoints" / "last.ckpt"
    data = bytearray(last.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = os.urandom(64)  # inside a tensor's record
    last.write_bytes(bytes(data))
    before = snapshot(run_dir)
    refused = run_train_forked(*args, "resume=true")
    errors = [line for line in refused.stderr.splitlines() if line.startswith("lightbert: error:")]
    assert refused.returncode == 2 and len(errors) == 1, refused.stderr[-3000:]
    assert f"{last} is damaged" in errors[0] and "resumed from" not in refused.stdout + refused.stderr
    assert snapshot(run_dir) == before  # nothing written, the damaged file kept
    # The run keeps one checkpoint with its training state (last.ckpt); the best one holds weights to start from.
    older = Path(re.search(r"init_from=(\S+) and another hydra.run.dir", errors[0]).group(1))
    assert older.parent == last.parent and older.name != "last.ckpt"
    again = [a for a in args if not a.startswith("hydra.run.dir=")]
    started = run_train_forked(*again, f"init_from={older}", f"hydra.run.dir={tmp_path / 'again'}")
    assert started.returncode == 0, started.stderr[-3000:]


def test_a_phase_with_its_own_batch_says_the_global_batch_it_trains(tmp_path, corpus_file):
    """task.global_batch_size=8 with the modern quick start, whose second phase trains batch_size 4: the phase
    trains 4 sequences a step, which nothing said (the setting seemed to do nothing there). Its phase line says it."""
    done = run_train_forked(
        "experiment=modern_quick_start",
        "logger=csv",
        "task.datamodule.num_workers=0",
        "task.datamodule.vocab_size=400",
        "task.global_batch_size=8",
        "trainer.max_steps=10",
        f"corpus.paths=[{corpus_file}]",
        "corpus=text",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "phase 2/2: steps 9-10" in line]
    assert len(lines) == 1, (done.stdout + done.stderr)[-3000:]
    assert lines[0].endswith(
        "; 4 sequences a step (4 per device x 1 device(s) x 1 accumulated), where task.global_batch_size=8 sets the "
        "first phase's"
    )


def test_a_refusal_after_wandb_started_does_not_offer_to_upload_what_it_took_back(tmp_path):
    """A bad row found once training set up its data, with the default W&B logger (offline): the command is refused
    and its run directory taken back, W&B's files with it. Before, it still printed "upload it with: wandb sync
    <dir>" for the directory it then removed."""
    from helpers.glue_files import glue_data_files, glue_overrides
    from helpers.models import write_hf_bert

    bert_dir = write_hf_bert(tmp_path / "bert")
    files = glue_data_files(tmp_path / "data", "sst2", ext="jsonl")
    rows = files["train"].read_text().splitlines()
    files["train"].write_text("\n".join([*rows, '{"sentence": "a film", "label": 7, "idx": 99}']) + "\n")
    run_dir = tmp_path / "run"
    overrides = [o for o in glue_overrides("sst2", files, bert_dir) if o != "logger=csv"]  # the default: wandb
    refused = run_train_forked(*overrides, f"hydra.run.dir={run_dir}", WANDB_API_KEY="", WANDB_MODE="offline")
    errors = [line for line in refused.stderr.splitlines() if line.startswith("lightbert: error:")]
    assert refused.returncode == 2 and len(errors) == 1, refused.stderr[-3000:]
    assert "wandb sync" not in refused.stdout + refused.stderr
    assert not run_dir.exists() or not any(run_dir.iterdir())

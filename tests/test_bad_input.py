"""The bad-input table, run through the command line as a user would: src/train.py in a process of its own, forked
from one that has done the imports once (`helpers.fork_server`: a second per case instead of seven or more).

Each refused case ends with exit code 2 and one line, `lightbert: error: ...`, that names the key, file or row
to fix; no traceback. The silent cases now say what happened on the console, counted, and still run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.filesystems import full_disk, read_only_directory
from helpers.glue_files import glue_data_files
from helpers.models import write_hf_bert
from helpers.ner_files import ner_sentences, write_conll_text
from helpers.runs import run_train_forked, snapshot, write_bert_corpus
from helpers.squad_files import squad_data_files
from helpers.swag_files import swag_data_files

pytestmark = pytest.mark.slow

PRETRAIN = [
    "model=bert_tiny",
    "logger=csv",
    "trainer.max_steps=2",
    "task.batch_size=4",
    "task.max_seq_length=32",
    "task.datamodule.vocab_size=300",
    "task.datamodule.num_workers=0",
    "corpus=text",
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """Every file the table's cases point at, written once."""
    root = tmp_path_factory.mktemp("inputs")
    paths = {"root": root, "corpus": write_bert_corpus(root / "corpus.txt", num_documents=8)}
    paths["bert"] = write_hf_bert(root / "bert")
    paths["bert_without_tokenizer"] = shutil.copytree(paths["bert"], root / "bert_without_tokenizer")
    (paths["bert_without_tokenizer"] / "vocab.txt").unlink()
    (root / "blank.txt").write_text("\n\n   \n\n")
    paths["blank"] = root / "blank.txt"
    (root / "corpus_dir").mkdir()
    shutil.copy(paths["corpus"], root / "corpus_dir" / "part1.txt")
    (root / "random.ckpt").write_bytes(bytes(range(256)) * 40)
    paths["random_ckpt"] = root / "random.ckpt"
    truncated = root / "truncated_run" / "checkpoints"
    truncated.mkdir(parents=True)
    (truncated / "last.ckpt").write_bytes(b"PK\x03\x04" + b"\x00" * 300)  # a zip header cut short by a full disk
    paths["truncated_run"] = root / "truncated_run"
    paths["not_a_run"] = root / "exported"  # e.g. what `convert to-hf` wrote
    paths["not_a_run"].mkdir()
    (paths["not_a_run"] / "tokenizer.json").write_text("{}")
    (paths["not_a_run"] / "config.json").write_text("{}")
    glue = glue_data_files(root / "glue", "sst2")
    paths |= {f"glue_{split}": path for split, path in glue.items()}
    (root / "header_only.csv").write_text("sentence,label\n")
    paths["header_only"] = root / "header_only.csv"
    lines = glue["train"].read_text().splitlines()
    rows = [json.dumps({"sentence": line.rsplit(",", 2)[0], "label": 1}) for line in lines[1:4]]
    rows[1] = rows[1][:-5]  # a record cut in the middle
    (root / "broken.jsonl").write_text("\n".join(rows) + "\n")
    paths["broken_jsonl"] = root / "broken.jsonl"
    squad = squad_data_files(root / "squad")
    data = json.loads(squad["train"].read_text())
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                qa["answers"] = []
    (root / "squad_no_answers.json").write_text(json.dumps(data))
    paths["squad_no_answers"] = root / "squad_no_answers.json"
    paths["squad_validation"] = squad["validation"]
    changes = (("squad_null_context", None), ("squad_far_answer", 1e30), ("squad_start_not_a_number", "12a"))
    for name, value in changes:
        broken = json.loads(squad["train"].read_text())
        paragraph = broken["data"][0]["paragraphs"][0]
        if name == "squad_null_context":
            paragraph["context"] = None
        else:
            paragraph["qas"][0]["answers"][0]["answer_start"] = value
        (root / f"{name}.json").write_text(json.dumps(broken))
        paths[name] = root / f"{name}.json"
    tsv = glue_data_files(root / "glue_tsv", "sst2", "tsv")
    lines = tsv["train"].read_text().splitlines()
    (root / "trailing_tabs.tsv").write_text("\n".join([lines[0], *(line + "\t" for line in lines[1:])]) + "\n")
    paths["trailing_tabs"] = root / "trailing_tabs.tsv"
    cells = lines[2].split("\t")
    cells[0] = cells[0].replace(" ", "\t", 1)  # a tab inside the sentence
    (root / "tab_in_cell.tsv").write_text("\n".join([*lines[:2], "\t".join(cells), *lines[3:]]) + "\n")
    paths["tab_in_cell"] = root / "tab_in_cell.tsv"
    flat = {"id": "a", "title": "t", "context": "the river of oslo is blue.", "question": "what is the river?"}
    (root / "squad_flat_no_start.jsonl").write_text(
        json.dumps({**flat, "answers": {"text": ["blue"], "answer_start": []}}) + "\n"
    )
    paths["squad_flat_no_start"] = root / "squad_flat_no_start.jsonl"
    csv_lines = glue["train"].read_text().splitlines()
    csv_lines[3] = '"' + csv_lines[3]  # a quote opened and never closed
    (root / "open_quote.csv").write_text("\n".join(csv_lines) + "\n")
    paths["open_quote"] = root / "open_quote.csv"
    (root / "surrogate.jsonl").write_text(
        '{"sentence": "fine", "label": 1}\n{"sentence": "the \\ud800 film", "label": 0}\n'
    )
    paths["surrogate"] = root / "surrogate.jsonl"
    test_rows = glue["test"].read_text().splitlines()
    header = test_rows[0].split(",")
    at = header.index("idx")
    renumbered = [test_rows[0]] + [
        ",".join([*r.split(",")[:at], f"s{n}", *r.split(",")[at + 1 :]]) for n, r in enumerate(test_rows[1:])
    ]
    (root / "string_idx.csv").write_text("\n".join(renumbered) + "\n")
    paths["string_idx"] = root / "string_idx.csv"
    (root / "ner_string.jsonl").write_text('{"id": "0", "tokens": "germany .", "ner_tags": [5, 0]}\n')
    paths["ner_string"] = root / "ner_string.jsonl"
    text = paths["corpus"].read_text()
    paths["utf16"] = root / "utf16.txt"
    paths["utf16"].write_bytes(text.encode("utf-16"))  # with a byte-order mark, as Windows' Notepad saves "Unicode"
    paths["utf16_no_bom"] = root / "utf16_no_bom.txt"
    paths["utf16_no_bom"].write_bytes(text.encode("utf-16-be"))  # without one: it decodes as UTF-8, NULs and all
    return paths


def glue(inputs, train: str = "glue_train") -> list[str]:
    return [
        "task=glue/sst2",
        "trainer=cpu",
        "logger=csv",
        "trainer.max_steps=1",
        f"init_from={inputs['bert']}",
        f"task.data_files.train={inputs[train]}",
        f"task.data_files.validation={inputs['glue_validation']}",
    ]


SQUAD_SIZES = ["task.max_seq_length=128", "task.doc_stride=32", "task.max_query_length=16"]


def squad(inputs, train: str) -> list[str]:
    return [
        "task=squad_v1",
        "trainer=cpu",
        "logger=csv",
        *SQUAD_SIZES,
        f"init_from={inputs['bert']}",
        f"task.data_files.train={inputs[train]}",
        f"task.data_files.validation={inputs['squad_validation']}",
    ]


# (case, the command's arguments given the inputs, what its one error line says)
REFUSED = [
    # values that once raised tracebacks
    ("max_steps not a number", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "trainer.max_steps=abc"],
     "trainer.max_steps must be an integer, got 'abc'"),
    ("seed not a number", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "seed=abc"],
     "seed must be an integer"),
    ("lr not a number", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "optim.lr=abc"],
     "optim.lr must be a number, got 'abc'"),
    ("batch size 0", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "task.batch_size=0"],
     "task.batch_size must be >= 1, got 0"),
    ("batch size negative", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "task.batch_size=-4"],
     "task.batch_size must be >= 1, got -4"),
    ("no step or epoch limit", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "trainer.max_steps=-1"],
     "trainer.max_steps=-1 and trainer.max_epochs=-1"),
    ("accumulation 0", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "trainer.accumulate_grad_batches=0"],
     "trainer.accumulate_grad_batches must be >= 1"),
    ("dupe factor 0", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "task.datamodule.dupe_factor=0"],
     "task.datamodule.dupe_factor must be >= 1"),
    ("corpus of blank lines", lambda i: [*PRETRAIN, f"corpus.paths=[{i['blank']}]"], "0 usable documents"),
    ("run directory under a file", lambda i: [*PRETRAIN, f"hydra.run.dir={i['corpus']}/run"],
     "is a file, not a directory"),
    ("validation interval 0", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "trainer.val_check_interval=0"],
     "trainer.val_check_interval must be > 0, got 0"),
    ("seed past numpy's", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "seed=99999999999999999999"],
     "seed must be from 0 to 4294967295"),
    ("no devices", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "trainer.devices=0"],
     "trainer.devices=0 is not a number of devices"),
    ("devices not a number", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "trainer.devices=abc"],
     "trainer.devices='abc' is not a number of devices"),
    ("unknown precision", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "trainer.precision=bogus"],
     "trainer.precision='bogus' is not a precision"),
    ("bf16-true under FSDP", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "trainer=fsdp",
                                        "trainer.precision=bf16-true"],
     "trainer.precision=bf16-true (a bf16 model with fp32 master weights in the optimizer) does not run under "
     "trainer=fsdp; use trainer.precision=bf16-mixed with FSDP"),
    ("16-mixed under FSDP", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "trainer=fsdp",
                                       "trainer.precision=16-mixed"],
     "trainer.precision=16-mixed (fp16 with a loss scaler) does not run under trainer=fsdp; use "
     "trainer.precision=bf16-mixed"),
    ("unknown compile mode", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "speed.compile_mode=fast"],
     "speed.compile_mode=fast is not known; valid: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs"),
    ("CUDA graphs with accumulation", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "speed.compile=true",
                                                 "speed.compile_mode=reduce-overhead", "task.datamodule.packing=true",
                                                 "trainer.accumulate_grad_batches=2"],
     "speed.compile_mode=reduce-overhead (CUDA graphs) cannot run with trainer.accumulate_grad_batches=2"),
    ("unknown unpadding", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "speed.unpad=auto"],
     "speed.unpad=auto is not known; valid: true (by the device), false, groups, varlen"),
    ("unknown matmul precision", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "speed.matmul_precision=tf32"],
     "speed.matmul_precision must be one of highest, high, medium, got tf32"),
    ("the trainer removed", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "~trainer"],
     "the config has no trainer (an override ~trainer?)"),
    ("the data module removed", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "~task.datamodule"],
     "the config has no task.datamodule"),
    ("an interpolation of itself", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "optim.lr=${optim.lr}"],
     "optim.lr cannot be resolved (Recursive interpolation detected)"),
    ("a directory that is not a run's", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]",
                                                   f"hydra.run.dir={i['not_a_run']}"], "is not a run directory"),
    ("truncated last.ckpt", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]", "resume=true",
                                        f"hydra.run.dir={i['truncated_run']}"], "is damaged (not a whole checkpoint"),
    # messages that once misled
    ("a directory as corpus file", lambda i: [*PRETRAIN, f"corpus.paths=[{i['root'] / 'corpus_dir'}]"],
     "is a directory; give its files"),
    ("a glob that matches nothing", lambda i: [*PRETRAIN, f"corpus.paths=[{i['root'] / 'nothing'}/*.txt]"],
     "matches no file"),
    ("HF directory without tokenizer", lambda i: [*glue(i)[:4], f"init_from={i['bert_without_tokenizer']}",
                                                  *glue(i)[5:]], "comes without its tokenizer"),
    ("random bytes as .ckpt", lambda i: [*glue(i)[:4], f"init_from={i['random_ckpt']}", *glue(i)[5:]],
     "is not a lightbert or Lightning checkpoint"),
    ("SQuAD file without answers", lambda i: ["task=squad_v1", "trainer=cpu", "logger=csv", *SQUAD_SIZES,
                                              f"init_from={i['bert']}",
                                              f"task.data_files.train={i['squad_no_answers']}",
                                              f"task.data_files.validation={i['squad_validation']}"],
     "v1.1 training questions have no answer"),
    ("malformed JSON lines", lambda i: glue(i, "broken_jsonl"), "line 2, column"),
    ("TSV rows ending in a tab", lambda i: glue(i, "trailing_tabs"), "line 2 has 4 cells and the header 3"),
    ("CSV quote never closed", lambda i: glue(i, "open_quote"), "line 4: unexpected end of data (a quote opened"),
    ("lone surrogate in JSON lines", lambda i: glue(i, "surrogate"), "line 2 holds a lone surrogate"),
    ("GLUE idx that are not numbers", lambda i: [*glue(i), f"task.data_files.test={i['string_idx']}"],
     "idx 's0' is not a whole number"),
    ("NER tokens as one string", lambda i: ["task=conll2003", "trainer=cpu", "logger=csv", f"init_from={i['bert']}",
                                            f"task.data_files.train={i['ner_string']}",
                                            f"task.data_files.validation={i['ner_string']}"],
     "sentence 0: tokens is 'germany .', not a list"),
    ("SQuAD null context", lambda i: ["task=squad_v1", "trainer=cpu", "logger=csv", *SQUAD_SIZES,
                                      f"init_from={i['bert']}", f"task.data_files.train={i['squad_null_context']}",
                                      f"task.data_files.validation={i['squad_validation']}"],
     "context is None, not text"),
    ("SQuAD answer_start past any text", lambda i: ["task=squad_v1", "trainer=cpu", "logger=csv", *SQUAD_SIZES,
                                                    f"init_from={i['bert']}",
                                                    f"task.data_files.train={i['squad_far_answer']}",
                                                    f"task.data_files.validation={i['squad_validation']}"],
     "answer_start 1e+30 is not a character position"),
    ("header-only file", lambda i: glue(i, "header_only"), "holds a header and no rows"),
    ("TSV tab inside a cell", lambda i: glue(i, "tab_in_cell"), "line 3 has 4 cells and the header 3"),
    ("SQuAD answer_start not a number", lambda i: squad(i, "squad_start_not_a_number"),
     "question q1-0-0: answer_start '12a' is not a character position"),
    ("SQuAD flat answer without answer_start", lambda i: squad(i, "squad_flat_no_start"),
     "question a: answers has 1 text(s) and answer_start []"),
    ("validation share above 1", lambda i: [*PRETRAIN, f"corpus.paths=[{i['corpus']}]",
                                            "task.datamodule.validation_share=1.5"],
     "task.datamodule.validation_share must be > 0 and <= 1, got 1.5"),
    ("UTF-16 corpus", lambda i: [*PRETRAIN, f"corpus.paths=[{i['utf16']}]"],
     "it is UTF-16LE text; convert it, e.g. `iconv -f UTF-16 -t utf-8 utf16.txt > utf16.utf8.txt`"),
    ("a UserError in a DataLoader worker", lambda i: [*(a for a in PRETRAIN if "num_workers" not in a),
                                                      f"corpus.paths=[{i['corpus']}]", "task.datamodule.streaming=true",
                                                      "task.datamodule.num_workers=2",
                                                      "task.datamodule.validation_documents=7"],
     "the streamed corpus has no document for reader"),
    ("UTF-16 corpus without a byte-order mark", lambda i: [*PRETRAIN, f"corpus.paths=[{i['utf16_no_bom']}]"],
     "it is UTF-16BE text; convert it, e.g. `iconv -f UTF-16BE -t utf-8"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "args", "message"), REFUSED, ids=[case for case, _, _ in REFUSED])
def test_bad_input_is_one_message(inputs, tmp_path, case, args, message):
    arguments = args(inputs)
    new_directory = not any(a.startswith("hydra.run.dir=") for a in arguments)
    if new_directory:
        arguments.append(f"hydra.run.dir={tmp_path / 'run'}")
    run = run_train_forked(*arguments)
    errors = [line for line in run.stderr.splitlines() if line.startswith("lightbert: error:")]
    assert run.returncode == 2, run.stderr[-3000:]
    assert len(errors) == 1 and message in errors[0], run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "weights_only=False" not in run.stderr
    if new_directory:  # a refused command writes nothing there, however late it is refused
        assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def one_error_line(run) -> str:
    """The command's only error line, after exit 2 and with no traceback on the console."""
    errors = [line for line in run.stderr.splitlines() if line.startswith("lightbert: error:")]
    assert run.returncode == 2 and len(errors) == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Traceback" not in run.stderr + run.stdout
    return errors[0]


@pytest.mark.parametrize("given", ["paths.cache_dir", "LIGHTBERT_CACHE"])
def test_a_read_only_cache_is_refused_before_anything_is_written(inputs, tmp_path, given):
    """A cache on a read-only mount: once an OSError traceback from datasets, after .hydra/ and train.log."""
    with read_only_directory(tmp_path / "cache") as cache:
        how = {"LIGHTBERT_CACHE": str(cache)} if given == "LIGHTBERT_CACHE" else {}
        args = [*glue(inputs), f"hydra.run.dir={tmp_path / 'run'}"]
        run = run_train_forked(*args, *([f"paths.cache_dir={cache}"] if not how else []), **how)
    error = one_error_line(run)
    assert f"the cache paths.cache_dir={cache} cannot be written: {cache} is " in error
    assert "Point it at a writable directory with paths.cache_dir=" in error
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


@pytest.mark.parametrize(
    ("task", "free"),
    [("glue", 0), ("pretrain", 32 * 1024)],
    ids=["no-room-at-all", "full-while-writing"],
)
def test_a_full_cache_disk_is_one_line_and_leaves_nothing(inputs, tmp_path, task, free):
    """The cache on a full disk: datasets' own check of the free space (an OSError), or ENOSPC while it writes the
    corpus's Arrow file (once a DatasetGenerationError traceback with ENOSPC inside, after .hydra/ and train.log were
    written). Now one line, and the run's record taken back."""
    if task == "glue":
        args = glue(inputs)
    else:  # a corpus of about 130 KB, four times the room left
        corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=300)
        args = [*PRETRAIN, f"corpus.paths=[{corpus}]"]
    with full_disk(tmp_path / "cache", free) as cache:
        run = run_train_forked(*args, f"hydra.run.dir={tmp_path / 'run'}", f"paths.cache_dir={cache}")
    error = one_error_line(run)
    assert f"could not write the cache {cache}" in error and "No space left on device" in error, error
    assert "move the cache with paths.cache_dir=..." in error
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_a_fine_tunes_checkpoint_in_a_pretraining_run_is_refused_naming_both(inputs, tmp_path, sst2_run):
    """A fine-tune's last.ckpt copied into a pre-training run directory, resume=true: once "resumed from step N", then
    a load_state_dict traceback."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copy(sst2_run.results["last_checkpoint"], run_dir / "checkpoints" / "last.ckpt")
    before = snapshot(run_dir)
    run = run_train_forked(*PRETRAIN, f"corpus.paths=[{inputs['corpus']}]", "resume=true", f"hydra.run.dir={run_dir}")
    error = one_error_line(run)
    assert (
        "is a checkpoint of fine-tuning (sequence classification, sst2), and this command (task=pretrain) runs "
        "pre-training"
        in error
        and f"init_from={run_dir / 'checkpoints' / 'last.ckpt'}" in error
    )
    assert "resumed from" not in run.stdout and snapshot(run_dir) == before


def test_a_multirun_with_failed_jobs_ends_with_its_summary_and_no_traceback(inputs, tmp_path):
    run = run_train_forked(
        "-m", *PRETRAIN, f"corpus.paths=[{inputs['corpus']}]", "task.batch_size=0,-1", f"hydra.sweep.dir={tmp_path}"
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "2 jobs, 2 failed; summary in" in run.stdout + run.stderr


def test_what_the_data_loses_is_said_on_the_console_counted(inputs, tmp_path):
    train = inputs["glue_train"].read_text().splitlines()
    assert train[0] == "sentence,label,idx"
    train[1] = '"",1,0'  # an empty sentence
    train[2] = " ".join(["film"] * 200_000) + ",0,1"  # 200,000 words
    (tmp_path / "train.csv").write_text("\n".join(train) + "\n")
    args = glue(inputs)
    args[5] = f"task.data_files.train={tmp_path / 'train.csv'}"
    run = run_train_forked(*args, f"hydra.run.dir={tmp_path / 'run'}")
    assert run.returncode == 0, run.stderr[-3000:]
    console = run.stdout + run.stderr
    assert "1 rows were cut to max_seq_length=128 tokens" in console
    assert "1 rows have an empty text" in console
    assert console.count("the sequence classification head starts fresh") == 1  # the new head, once
    # "resume=true and no .../last.ckpt yet" on a fresh run's console: test_trainers' console test (its line 2)


def test_a_fine_tune_without_a_pooler_starts_a_classifier_with_a_fresh_pooler(inputs):
    """A SQuAD or NER fine-tune has no pooler: used as init_from for GLUE, it no longer says "not a BERT checkpoint
    lightbert can start from"; the pooler starts fresh with the head, and the console says so."""
    from lightbert.checkpoints.reading import load_into, load_pretrained
    from lightbert.model import BertConfig, BertForSequenceClassification

    pretrained = load_pretrained(str(inputs["bert"]))
    pretrained.state_dict = {k: v for k, v in pretrained.state_dict.items() if not k.startswith("bert.pooler.")}
    model = BertForSequenceClassification(BertConfig.from_dict(pretrained.config), 2)
    fresh = load_into(model, pretrained)
    assert {k for k in fresh if k.startswith("bert.")} == {"bert.pooler.dense.weight", "bert.pooler.dense.bias"}


def _swag_with_an_empty_ending(directory: Path) -> list[str]:
    import csv

    files = swag_data_files(directory, sizes=(8, 4))
    rows = list(csv.DictReader(files["train"].read_text().splitlines()))
    rows[0]["ending2"] = ""
    with files["train"].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return ["task=swag", *(f"task.data_files.{split}={path}" for split, path in files.items())]


def _ner_with_a_long_sentence(directory: Path) -> list[str]:
    sentences = ner_sentences(8, seed=1)
    sentences[0] = (["city"] * 300, ["O"] * 300)
    files = {"train": write_conll_text(directory / "train.txt", sentences),
             "validation": write_conll_text(directory / "dev.txt", ner_sentences(4, seed=2))}  # fmt: skip
    return ["task=conll2003", *(f"task.data_files.{split}={path}" for split, path in files.items())]


def _squad_with_a_moved_answer(directory: Path) -> list[str]:
    files = squad_data_files(directory, num_paragraphs=2)
    data = json.loads(files["train"].read_text())
    data["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] += 3  # off by three characters
    files["train"].write_text(json.dumps(data))
    return ["task=squad_v1", *SQUAD_SIZES, *(f"task.data_files.{split}={path}" for split, path in files.items())]


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (_swag_with_an_empty_ending, "1 endings are empty"),
        (_ner_with_a_long_sentence, "1 sentence(s) longer than task.max_seq_length=128 sub-tokens were cut"),
        (_squad_with_a_moved_answer, "1 answers do not start at their answer_start; moved to the nearest"),
    ],
    ids=["swag-empty-ending", "ner-cut-sentence", "squad-moved-answer"],
)
def test_what_a_fine_tuning_set_loses_is_said_once(inputs, tmp_path, make, said):
    args = [*make(tmp_path / "data"), "trainer=cpu", "logger=csv", "trainer.max_steps=1", f"init_from={inputs['bert']}"]
    run = run_train_forked(*args, f"hydra.run.dir={tmp_path / 'run'}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert (run.stdout + run.stderr).count(said) == 1

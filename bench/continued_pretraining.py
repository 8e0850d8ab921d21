"""Continued pre-training on a second domain, measured on CPU: does it help a released model on that domain's task?

    python bench/continued_pretraining.py --out outputs/continued_pretraining --report bench/RESULTS.md

1. "The released checkpoint": `src/train.py experiment=quick_start trainer.max_steps=1000` (bert_tiny on the demo
   corpus, Python's own documentation: the language reference and the standard library's docstrings; a third of
   the quick start's steps, for the benchmark's time on a shared 2-core machine).
2. The second domain: this machine's Unix manual pages (`/usr/share/man/man1`-`man8`, English, roff source read
   here without groff). Why: they are on most Linux machines, need no network, are human-written technical prose,
   and the Python docs never held them (they mention a few system calls, not the manuals' text: options, daemons,
   devices, C library functions). Google Cloud SDK's 16,600 generated `gcloud` pages, one tool's boilerplate, are
   left out. The pages are split by a hash of their name: 80% for continued pre-training, 20% held out.
3. Continued pre-training of the released model on the 80%, twice, with the same steps and schedule: with its own
   vocabulary, and with `task.datamodule.add_words` words of the domain added.
4. The domain's held-out MLM loss of every model (the same masked batches for the two with the released
   vocabulary), and the pieces per word of held-out text under each vocabulary.
5. A classification task made from the held-out pages only: is a sentence from a user command's page (section 1)
   or a system administration command's (section 8)? Sentences of one page are all in train or all in dev; the two
   labels balanced. Each model fine-tuned on it with 3 seeds: dev accuracy after the last epoch (no selection).

The report (`--report`) appends the table, the command and the stages' wall times.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAN = Path("/usr/share/man")

# -- the domain: manual pages as prose -------------------------------------------------------------------------

_FONT = re.compile(r"\\f(\[[^\]]*\]|\(..|.)")
_STRING = re.compile(r"\\\*(\[[^\]]*\]|\(..|.)")
_SIZE = re.compile(r"\\s[+-]?\d+")
_NAMED = {"em": " - ", "en": "-", "aq": "'", "dq": '"', "lq": '"', "rq": '"', "oq": "'", "cq": "'", "bu": "",
          "co": "(c)", "rg": "(R)", "mu": "x", "ti": "~", "ha": "^", "ga": "`", "hy": "-", "pl": "+", ">=": ">=",
          "<=": "<="}  # fmt: skip
_NAMED_CHAR = re.compile(r"\\\((..)|\\\[(\w+)\]")
_ESCAPE = re.compile(r"\\(.)")
_BREAKS = {"PP", "P", "LP", "TP", "IP", "HP", "sp", "br", "RS", "RE", "in", "SS", "TQ", "PD", "ti", "ne"}
_CODE_START, _CODE_END = {"nf", "EX", "TS", "EQ"}, {"fi", "EE", "TE", "EN"}
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'])")


def _text(line: str) -> str:
    line = _FONT.sub("", line)
    line = _STRING.sub("", line)
    line = _SIZE.sub("", line)
    line = _NAMED_CHAR.sub(lambda m: _NAMED.get(m.group(1) or m.group(2), ""), line)
    return _ESCAPE.sub(lambda m: {"-": "-", "e": "\\", " ": " ", "~": " ", "0": " "}.get(m.group(1), ""), line)


def _macro_text(name: str, rest: str) -> str | None:
    """The text a font macro line prints (`.B`, `.BR`, ...); None for a macro that prints nothing we keep."""
    words = [w[1:-1] if len(w) > 1 and w[0] == w[-1] == '"' else w for w in re.findall(r'"[^"]*"|\S+', rest)]
    if name in ("B", "I", "SM", "SB"):
        return " ".join(words)
    if name in ("BR", "BI", "IR", "RB", "RI", "IB"):
        return "".join(words)
    return None


def man_page(path: Path) -> dict[str, list[str]]:
    """The prose of one page, by section (NAME, DESCRIPTION, OPTIONS, ...): a list of paragraphs each."""
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    sections: dict[str, list[str]] = {}
    section, paragraph, code = "", [], False

    def close() -> None:
        if paragraph and section:
            sections.setdefault(section, []).append(" ".join(paragraph))
        paragraph.clear()

    for line in lines:
        if line.startswith(('.\\"', "'\\\"", '.\\"')):
            continue
        if line.startswith((".", "'")):
            name, _, rest = line[1:].strip().partition(" ")
            if name in _CODE_START:
                close()
                code = True
            elif name in _CODE_END:
                code = False
            elif name in ("SH", "Sh"):
                close()
                section = _text(rest).strip('" ').upper()
            elif name in _BREAKS:
                close()
            elif not code:
                text = _macro_text(name, _text(rest))
                if text:
                    paragraph.append(text)
            continue
        if not code and line.strip():
            paragraph.append(_text(line).strip())
    close()
    return sections


def prose_sentences(paragraphs: list[str]) -> list[str]:
    """The sentences of paragraphs that read as prose: 5+ words, mostly letters, ending like a sentence."""
    sentences = []
    for paragraph in paragraphs:
        for sentence in _SENTENCE_END.split(" ".join(paragraph.split())):
            letters = sum(c.isalpha() or c == " " for c in sentence)
            if len(sentence.split()) >= 5 and letters >= 0.8 * len(sentence) and sentence[-1] in ".!?":
                sentences.append(sentence)
    return sentences


def manual_pages() -> list[tuple[str, int, list[str]]]:
    """(name, section, sentences) of every English page, gcloud's left out; pages with fewer than 2 sentences
    dropped (a pre-training document needs 2 for a next-sentence pair)."""
    pages = []
    for directory in sorted(MAN.glob("man[1-8]")):
        section = int(directory.name[3])
        for path in sorted(directory.glob("*.gz")):
            if path.name.startswith("gcloud") or path.is_symlink():
                continue
            sections = man_page(path)
            sentences = prose_sentences([p for name, ps in sections.items() if name not in ("NAME", "SYNOPSIS")
                                         for p in ps])  # fmt: skip
            if len(sentences) >= 2:
                pages.append((path.name, section, sentences))
    return pages


def held_out(name: str, share: float = 0.2) -> bool:
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < share


def write_bert_format(path: Path, documents: list[list[str]]) -> Path:
    path.write_text("".join("\n".join(d) + "\n\n" for d in documents), encoding="utf-8")
    return path


def section_task(pages, directory: Path, per_label: tuple[int, int], seed: int = 0) -> dict[str, Path]:
    """SST-2's schema (sentence, label) from held-out pages: label 1 for a sentence of a section 8 page (system
    administration), 0 for section 1 (user commands). Pages split into train and dev by a second hash; each label
    sampled to the same count."""
    rng = random.Random(seed)
    split: dict[str, dict[int, list[str]]] = {"train": {0: [], 1: []}, "validation": {0: [], 1: []}}
    for name, section, sentences in pages:
        if section in (1, 8):
            which = "validation" if held_out("dev/" + name, 0.4) else "train"
            split[which][int(section == 8)].extend(sentences)
    files = {}
    for (which, rows), count in zip(split.items(), per_label, strict=True):
        n = min(count, len(rows[0]), len(rows[1]))
        examples = [(s, label) for label in (0, 1) for s in rng.sample(rows[label], n)]
        rng.shuffle(examples)
        files[which] = directory / f"{which}.csv"
        with files[which].open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence", "label"])
            writer.writerows(examples)
    return files


def build_data(directory: Path, per_label: tuple[int, int], most_mb: float) -> dict:
    """The continued pre-training corpus (at most `most_mb` MB of the pages not held out, a seeded sample of them),
    the held-out pages, and the task's files."""
    directory.mkdir(parents=True, exist_ok=True)
    pages = manual_pages()
    if len(pages) < 200 or not any(section == 8 for _, section, _ in pages):
        sys.exit(
            f"continued_pretraining.py: {len(pages)} English manual pages under {MAN} (sections 1 and 8 needed, a few "
            "hundred at least): on Debian or Ubuntu, `apt install man-db manpages` and unminimize a minimal image"
        )
    train = [sentences for name, _, sentences in pages if not held_out(name)]
    random.Random(0).shuffle(train)
    size, kept = 0, []
    for sentences in train:
        size += sum(len(s) + 1 for s in sentences) + 1
        if size > most_mb * 1e6:
            break
        kept.append(sentences)
    train = kept
    test = [p for p in pages if held_out(p[0])]
    files = {
        "domain_train": write_bert_format(directory / "man_train.txt", train),
        "domain_heldout": write_bert_format(directory / "man_heldout.txt", [s for _, _, s in test]),
        **section_task(test, directory, per_label),
    }
    sizes = {k: len(v.read_text(encoding="utf-8").splitlines()) for k, v in files.items()}
    return {"files": {k: str(v) for k, v in files.items()}, "pages": len(pages), "pretraining_pages": len(train),
            "held_out_pages": len(test), "lines": sizes,
            "pretraining_mb": round(files["domain_train"].stat().st_size / 1e6, 2)}  # fmt: skip


# -- the measurements ------------------------------------------------------------------------------------------


def domain_mlm_loss(run_dir: Path, documents: list[list[str]], seed: int = 0, max_seq_length: int = 64) -> dict:
    """The masked-LM loss and accuracy of `run_dir`'s checkpoint on sentence pairs of `documents`, masked as a
    validation split is (80/10/10 of 15%, each example by its own seed): the same masks for models that share a
    tokenizer."""
    import torch
    import torch.nn.functional as F

    from lightbert.checkpoints.reading import load_into, load_pretrained
    from lightbert.data.encoding import IGNORE_INDEX
    from lightbert.model import BertConfig, BertForPreTraining
    from lightbert.tasks.pretraining.masking import MaskingCollator
    from lightbert.tasks.pretraining.resumable import SeededExamples
    from lightbert.tasks.pretraining.streaming import held_out_examples

    pretrained = load_pretrained(str(run_dir))
    model = BertForPreTraining(BertConfig.from_dict(pretrained.config))
    load_into(model, pretrained)
    model.eval()
    tokenizer = pretrained.tokenizer
    examples = SeededExamples(held_out_examples(documents, tokenizer, max_seq_length, 0.1, seed), seed, "validation")
    collate = MaskingCollator(tokenizer.vocab_size, tokenizer.pad_id, tokenizer.mask_id, tokenizer.special_ids)
    total, right, count = 0.0, 0, 0
    with torch.no_grad():
        for start in range(0, len(examples), 128):
            batch = collate(examples.__getitems__(list(range(start, min(start + 128, len(examples))))))
            masked = batch["labels"] != IGNORE_INDEX
            logits, _ = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], masked)
            labels = batch["labels"][masked]
            total += float(F.cross_entropy(logits.float(), labels, reduction="sum"))
            right += int((logits.argmax(-1) == labels).sum())
            count += labels.numel()
    return {"mlm_loss": total / count, "mlm_accuracy": right / count, "predictions": count,
            "examples": len(examples), "vocabulary": tokenizer.vocab_size}  # fmt: skip


def pieces_per_word(run_dir: Path, documents: list[list[str]]) -> float:
    from lightbert.checkpoints.reading import load_pretrained
    from lightbert.tasks.pretraining.domain_words import count_words, pieces_of

    tokenizer = load_pretrained(str(run_dir)).tokenizer
    return pieces_of(count_words(documents, tokenizer)[0], tokenizer).pieces_per_word


def read_documents(path: Path) -> list[list[str]]:
    from lightbert.tasks.pretraining.corpus import read_bert_format

    return list(read_bert_format(path))


def run(command: list[str], log: Path, env: dict) -> float:
    import os
    import subprocess

    started = time.time()
    with log.open("w") as out:
        result = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env})
    if result.returncode != 0:
        sys.exit(f"continued_pretraining.py: {' '.join(command[1:5])} ... failed; see {log}")
    return time.time() - started


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "continued_pretraining")
    parser.add_argument("--released", type=Path, default=None, help="a quick_start run to reuse as the released model")
    parser.add_argument("--released-steps", type=int, default=1000, help="quick_start's steps (its own: 3000)")
    parser.add_argument("--steps", type=int, default=600, help="continued pre-training steps")
    parser.add_argument("--domain-mb", type=float, default=3.0, help="continued pre-training text, at most")
    parser.add_argument("--train-per-label", type=int, default=1000)
    parser.add_argument("--dev-per-label", type=int, default=500)
    parser.add_argument("--lr", default="5e-4", help="continued pre-training's peak learning rate")
    parser.add_argument("--add-words", type=int, default=500)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--finetune-lr", default="1e-4")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--heldout-documents", type=int, default=300, help="held-out pages the MLM loss reads")
    parser.add_argument("--report", type=Path, default=None, help="append the report here (e.g. bench/RESULTS.md)")
    args = parser.parse_args()
    out = args.out.resolve()
    if out.exists():
        sys.exit(f"continued_pretraining.py: {out} exists; choose a new --out")
    out.mkdir(parents=True)
    env = {"LIGHTBERT_CACHE": str(out / "cache"), "TOKENIZERS_PARALLELISM": "false"}
    import os

    os.environ.update(env)
    python, times, logs = sys.executable, {}, out / "logs"
    logs.mkdir()

    started = time.time()
    data = build_data(out / "data", (args.train_per_label, args.dev_per_label), args.domain_mb)
    files = {k: Path(v) for k, v in data["files"].items()}
    times["data"] = time.time() - started

    released = args.released.resolve() if args.released else out / "released"
    if args.released is None:
        command = [python, "src/train.py", "experiment=quick_start", f"trainer.max_steps={args.released_steps}",
                   "task.cpu_val_check_interval=250", "logger=csv", f"hydra.run.dir={released}"]  # fmt: skip
        times["released"] = run(command, logs / "released.log", env)

    common = [
        "task=pretrain", f"init_from={released}", "trainer=cpu", "logger=csv", "corpus=text",
        f"corpus.paths=[{files['domain_train']}]", f"trainer.max_steps={args.steps}", "task.batch_size=8",
        "task.max_seq_length=64", "task.datamodule.dupe_factor=1", f"optim.lr={args.lr}", "optim.warmup_ratio=0.06",
        f"task.cpu_val_check_interval={args.steps // 2}",
    ]  # fmt: skip
    variants = {"continued": [], "continued + words": [f"task.datamodule.add_words={args.add_words}"]}
    models = {"released": released}
    for name, extra in variants.items():
        directory = out / name.replace(" + ", "_")
        command = [python, "src/train.py", *common, *extra, f"hydra.run.dir={directory}"]
        times[name] = run(command, logs / f"{directory.name}.log", env)
        models[name] = directory

    started = time.time()
    heldout = read_documents(files["domain_heldout"])[: args.heldout_documents]
    mlm = {name: domain_mlm_loss(directory, heldout) for name, directory in models.items()}
    pieces = {name: pieces_per_word(directory, heldout) for name, directory in models.items()}
    times["held-out MLM loss"] = time.time() - started

    scores: dict[str, list[float]] = {}
    for name, directory in models.items():
        for seed in args.seeds.split(","):
            run_dir = out / "finetune" / f"{directory.name}-seed{seed}"
            command = [
                python, "src/train.py", "task=glue/sst2", f"init_from={directory}", "trainer=cpu", "logger=csv",
                f"task.data_files.train={files['train']}", f"task.data_files.validation={files['validation']}",
                f"seed={seed}", f"trainer.max_epochs={args.epochs}", "trainer.max_steps=-1", "task.max_seq_length=64",
                f"optim.lr={args.finetune_lr}", f"hydra.run.dir={run_dir}",
            ]  # fmt: skip
            times[f"fine-tune {name}"] = times.get(f"fine-tune {name}", 0) + run(
                command, logs / f"{run_dir.name}.log", env
            )
            results = json.loads((run_dir / "results.json").read_text())
            scores.setdefault(name, []).append(results["metrics"]["val/accuracy"])

    summary = {"data": data, "mlm": mlm, "pieces_per_word": pieces, "accuracy": scores, "seconds": times,
               "args": {k: str(v) for k, v in vars(args).items()}}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    report = render(summary, args)
    print(report)
    if args.report:
        with args.report.open("a") as f:
            f.write("\n" + report)


def render(summary: dict, args) -> str:
    mlm, pieces, scores, data = summary["mlm"], summary["pieces_per_word"], summary["accuracy"], summary["data"]
    rows = [
        f"| {name} | {mlm[name]['vocabulary']} | {pieces[name]:.3f} | {mlm[name]['mlm_loss']:.3f} | "
        f"{mlm[name]['mlm_accuracy']:.3f} | {spread(scores[name])} | {', '.join(f'{s:.3f}' for s in scores[name])} |"
        for name in mlm
    ]
    seconds = ", ".join(f"{k} {v:.0f} s" for k, v in summary["seconds"].items())
    return "\n".join(
        [
            "| model | vocabulary | pieces per word (held-out pages) | held-out MLM loss | MLM accuracy | "
            "section 1 vs 8: dev accuracy, mean ± sd | the seeds |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"Domain: {data['pages']} manual pages ({data['pretraining_pages']} for continued pre-training, "
            f"{data['pretraining_mb']} MB; {data['held_out_pages']} held out). Task: "
            f"{data['lines']['train'] - 1} train and {data['lines']['validation'] - 1} dev sentences of held-out "
            "pages. "
            f"Wall times: {seconds}.",
        ]
    )


if __name__ == "__main__":
    main()

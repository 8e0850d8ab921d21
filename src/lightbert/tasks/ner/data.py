"""CoNLL-2003 named-entity recognition (Tjong Kim Sang and De Meulder 2003) for token classification (paper §5.3).

Data comes from the hub (`eriktks/conll2003`: `tokens` and `ner_tags` columns, the tags as class indices) or from
local files, one per split (`task.data_files.<split>=PATH`): json, jsonl or parquet in the hub's columns (tags as
indices into `task.label_names` or as tag strings), or any other file in the CoNLL text format the shared task
distributed (`eng.train`, `train.txt`, ...): one word per line with its tag in the last column, a blank line
between sentences, `-DOCSTART-` lines between documents. Both IOB1 (the original files) and BIO (the hub's copy)
tags work; entity F1 reads spans from either (`lightbert.tasks.ner.metrics`).

Each sentence is `[CLS] sub-tokens [SEP]`; a word's label sits on its first sub-token and the other sub-tokens
are left out of the loss (IGNORE_INDEX), the paper's choice. A sentence longer than `max_seq_length` sub-tokens is cut;
the words cut off are predicted "O" in evaluation, and the count is logged. The paper used document context
around each sentence; like Hugging Face's run_ner, this is sentence by sentence.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import datasets
import torch

from lightbert.data.batches import pad_batch
from lightbert.data.encoding import IGNORE_INDEX, encode_pair
from lightbert.data.local_files import conversion_advice
from lightbert.data.tokenizer import BertTokenizer
from lightbert.errors import ParameterError, UserError
from lightbert.tasks.finetuning.datamodule import FineTuningDataModule
from lightbert.tasks.ner.metrics import ConllevalFiles, has_entities

log = logging.getLogger(__name__)

HUB_DATASET = "eriktks/conll2003"
CONLL2003_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
TABLE_FORMATS = (".json", ".jsonl", ".parquet")  # the hub's columns; any other file is CoNLL text


def read_conll_text(file: Path, where: str) -> datasets.Dataset:
    """Sentences of a CoNLL-format file: `tokens` and `ner_tags` (tag strings, the last column)."""
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise UserError(f"{where} is not UTF-8 text ({error}); {conversion_advice(file)}") from None
    sentences: list[tuple[list[str], list[str]]] = []
    words: list[str] = []
    tags: list[str] = []
    for number, line in enumerate([*text.splitlines(), ""], start=1):
        columns = line.split()
        if not columns or columns[0] == "-DOCSTART-":
            if words:
                sentences.append((words, tags))
                words, tags = [], []
            continue
        if len(columns) < 2:
            raise UserError(
                f"{where}, line {number}: {line.strip()!r} has no tag column; CoNLL files hold a word and its tag "
                "(the last column) per line"
            )
        words.append(columns[0])
        tags.append(columns[-1])
    if not sentences:
        raise UserError(f"{where} holds no sentences")
    return datasets.Dataset.from_dict(
        {
            "id": [str(i) for i in range(len(sentences))],
            "tokens": [s[0] for s in sentences],
            "ner_tags": [s[1] for s in sentences],
        }
    )


def tag_names(raw: datasets.Dataset, label_names: Sequence[str], where: str) -> list[list[str]]:
    """Every sentence's tags as strings, checked against the label set. Indices are read through the data's own
    class names when it has them (the hub's ClassLabel), else through `label_names`."""
    column_type = raw.features["ner_tags"]  # the Arrow schema's type of the column
    inner = getattr(column_type, "feature", None)
    own_names = getattr(inner, "names", None)
    names = list(own_names or label_names)
    known = set(label_names)
    out = []
    for sentence_id, tags in zip(raw["id"], raw["ner_tags"], strict=True):
        row = []
        for tag in tags:
            if isinstance(tag, int) and not isinstance(tag, bool):
                if not 0 <= tag < len(names):
                    raise UserError(
                        f"{where}, sentence {sentence_id}: tag index {tag} is out of range 0..{len(names) - 1}"
                    )
                tag = names[tag]
            if tag not in known:
                raise UserError(
                    f"{where}, sentence {sentence_id}: unknown tag {tag!r}; the label set is {list(label_names)} "
                    "(set task.label_names for another tag set)"
                )
            row.append(tag)
        out.append(row)
    return out


def encode_sentences(
    words: list[list[str]],
    tags: list[list[str]],
    tokenizer: BertTokenizer,
    label_names: Sequence[str],
    max_seq_length: int,
) -> tuple[dict[str, list], int]:
    """Sub-token ids with the label on each word's first sub-token; the number of sentences that were cut.

    `word_starts` holds each word's first sub-token position (-1 for a word cut off or without sub-tokens) and
    `word_labels` every word's label: evaluation scores whole sentences, whatever was cut.
    """
    label_id = {name: i for i, name in enumerate(label_names)}
    encodings = tokenizer.backend.encode_batch(words, is_pretokenized=True, add_special_tokens=False)
    rows: dict[str, list] = {"input_ids": [], "token_type_ids": [], "labels": [], "word_starts": [], "word_labels": []}
    cut = 0
    budget = max_seq_length - 2
    for sentence_words, sentence_tags, encoding in zip(words, tags, encodings, strict=True):
        ids = encoding.ids[:budget]
        cut += len(encoding.ids) > budget
        word_ids = encoding.word_ids[:budget]
        labels = [IGNORE_INDEX] * (len(ids) + 2)
        starts = [-1] * len(sentence_words)
        for position, word in enumerate(word_ids, start=1):  # +1: [CLS] comes first
            if word is not None and starts[word] == -1:
                starts[word] = position
                labels[position] = label_id[sentence_tags[word]]
        input_ids, token_type_ids = encode_pair(ids, None, tokenizer.cls_id, tokenizer.sep_id)
        rows["input_ids"].append(input_ids)
        rows["token_type_ids"].append(token_type_ids)
        rows["labels"].append(labels)
        rows["word_starts"].append(starts)
        rows["word_labels"].append([label_id[t] for t in sentence_tags])
    return rows, cut


def pad_lists(rows: list[dict], key: str, value: int, length: int | None = None) -> torch.Tensor:
    """Each row's list `key` padded with `value` to `length` (default: the longest)."""
    length = length or max(len(r[key]) for r in rows)
    out = torch.full((len(rows), length), value, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row[key])] = torch.as_tensor(row[key], dtype=torch.long)
    return out


class TokenCollator:
    """Pads sub-token inputs and labels (to the same length), word starts (-1) and word labels (IGNORE_INDEX)."""

    def __init__(self, pad_id: int, pad_to_multiple_of: int | tuple[int, ...] | None = 8):
        self.pad_id, self.pad_to_multiple_of = pad_id, pad_to_multiple_of

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        batch = pad_batch(rows, self.pad_id, self.pad_to_multiple_of, {"idx": ("idx", torch.long)})
        batch["labels"] = pad_lists(rows, "labels", IGNORE_INDEX, length=batch["input_ids"].shape[1])
        batch["word_starts"] = pad_lists(rows, "word_starts", -1)
        batch["word_labels"] = pad_lists(rows, "word_labels", IGNORE_INDEX)
        return batch


class ConllDataModule(FineTuningDataModule):
    """Sentences tokenised once per (data, tokenizer, length) and cached; the validation and test sets predicted
    in conlleval's format."""

    name = "conll2003"
    family = "ner"
    hub_dataset = HUB_DATASET
    test_splits = ("test",)
    predicts_validation = True
    file_formats = None  # CoNLL text files have any name (eng.train, train.txt)
    min_seq_length = 3

    @classmethod
    def token_types(cls, settings: Mapping) -> int:
        return 1  # one sentence

    def __init__(self, *, label_names: Sequence[str] = CONLL2003_LABELS, name: str = "conll2003", **shared):
        self.name = name
        if len(set(label_names)) != len(label_names):
            raise ParameterError(f"{{0}} must be distinct tags, got {list(label_names)}", "label_names")
        self.label_names = tuple(label_names)
        super().__init__(**shared)
        if not self.data_files and not has_entities(self.label_names):
            raise UserError(
                f"task={self.name} reads local files: task.data_files.train=PATH task.data_files.validation=PATH "
                "(CoNLL text, a word and its tag a line); the hub's CoNLL-2003 copy holds entity tags, not these"
            )

    def read_file(self, file: Path, where: str) -> datasets.Dataset:
        if file.suffix.lower() in TABLE_FORMATS:
            return super().read_file(file, where)
        return read_conll_text(file, where)

    def required_columns(self, split: str) -> tuple[str, ...]:
        return ("tokens", "ner_tags")

    def check(self, raw: datasets.Dataset, split: str, where: str) -> datasets.Dataset:
        if "id" not in raw.column_names:
            raw = raw.add_column("id", [str(i) for i in range(len(raw))])
        for sentence_id, words, tags in zip(raw["id"], raw["tokens"], raw["ner_tags"], strict=True):
            for name, value in (("tokens", words), ("ner_tags", tags)):
                if not isinstance(value, list):  # a string would be read one character a token
                    raise UserError(
                        f"{where}, sentence {sentence_id}: {name} is {value!r}, not a list; write the sentence's "
                        f'words and tags as lists, e.g. "tokens": ["Germany", "."], "ner_tags": ["B-LOC", "O"]'
                    )
        return raw

    def cache_settings(self) -> list:
        return [self.max_seq_length, list(self.label_names)]

    def encode(self, raw: datasets.Dataset, split: str, where: str) -> dict[str, datasets.Dataset]:
        words = [[str(w) for w in sentence] for sentence in raw["tokens"]]
        tags = tag_names(raw, self.label_names, where)
        for sentence_id, sentence_words, sentence_tags in zip(raw["id"], words, tags, strict=True):
            if len(sentence_words) != len(sentence_tags):
                raise UserError(
                    f"{where}, sentence {sentence_id}: {len(sentence_words)} tokens but {len(sentence_tags)} tags"
                )
        rows, cut = encode_sentences(words, tags, self.tokenizer, self.label_names, self.max_seq_length)
        if cut:
            log.warning(
                "%s: %d sentence(s) longer than task.max_seq_length=%d sub-tokens were cut; the words cut off "
                "are predicted %s",
                where,
                cut,
                self.max_seq_length,
                "O" if has_entities(self.label_names) else "no tag (counted wrong)",
            )
        encoded = datasets.Dataset.from_dict({**rows, "tokens": words, "id": list(raw["id"])})
        return {split: encoded.add_column("idx", list(range(len(encoded))))}

    def loader_columns(self, train: bool) -> list[str]:
        return ["input_ids", "token_type_ids", "labels", "word_starts", "word_labels", "idx"]

    def collator(self, train: bool) -> TokenCollator:
        return TokenCollator(self.tokenizer.pad_id, self.pad_to_multiple_of)

    def prediction_writer(self) -> ConllevalFiles:
        assert self.datasets is not None, "call setup() first"
        return ConllevalFiles(self.label_names, {split: self.datasets[split] for split in self.predict_splits})

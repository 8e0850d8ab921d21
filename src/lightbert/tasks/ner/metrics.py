"""Entity-level precision, recall and F1 for named-entity tags, as seqeval (and conlleval) define them, and word
accuracy, the score of tag sets without entities (part-of-speech tags).

An entity is a (type, first word, last word) triple read off a tag sequence; a predicted entity counts only when
its span and type both match a gold entity exactly. Spans are read with seqeval's default (lenient) rules, which
take IOB1 (CoNLL-2003's original files: I- starts an entity, B- only separates two adjacent ones of one type),
BIO/IOB2 (the hub's copy) and IOBES alike:

- an entity starts at a B- or S- tag, at an I- or E- tag after O (an I- without its B-), and wherever the type
  changes (B-PER I-ORG is two entities);
- it ends before O, before B-/S-, after E-/S-, and wherever the type changes.

A tag set is of entities when it has the tag "O" (outside every entity); part-of-speech tags have none, and are
scored by word accuracy alone (`WordAccuracy`: the share of words given their gold tag).

`EntityF1` keeps per-type counts (gold, predicted, correct); counts add up over batches and devices, so the
result is the same however the sentences were split.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import datasets
import torch
from torchmetrics import Metric

from lightbert.data.encoding import IGNORE_INDEX
from lightbert.files import write_atomically
from lightbert.tasks.finetuning.predictions import Predictions

Entity = tuple[str, int, int]  # (type, first word, last word), inclusive
NO_TAG = -1  # a word's predicted label index when it was cut off and the tag set has no "O" to give it


def has_entities(label_names: Sequence[str]) -> bool:
    """Whether the tags mark entities (scored by entity F1) rather than word classes (part-of-speech)."""
    return "O" in label_names


def _split(tag: str) -> tuple[str, str]:
    """("B", "PER") for "B-PER"; ("O", "") for "O"; a bare "B" or "I" has the type "_" as in seqeval."""
    if tag == "O" or not tag:
        return "O", ""
    prefix, _, kind = tag.partition("-")
    return prefix[:1], kind or "_"


def _ends(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    if prev_tag in ("E", "S"):
        return True
    if prev_tag in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev_tag not in ("O", ".") and prev_type != type_


def _starts(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    if tag in ("B", "S"):
        return True
    if prev_tag in ("E", "S", "O") and tag in ("E", "I"):
        return True
    return tag not in ("O", ".") and prev_type != type_


def entities(tags: Sequence[str]) -> list[Entity]:
    """The entities of one sentence's tags, in order."""
    found: list[Entity] = []
    prev_tag, prev_type, begin = "O", "", 0
    for i, full_tag in enumerate([*tags, "O"]):  # the trailing O closes an entity that runs to the end
        tag, type_ = _split(full_tag)
        if _ends(prev_tag, tag, prev_type, type_):
            found.append((prev_type, begin, i - 1))
        if _starts(prev_tag, tag, prev_type, type_):
            begin = i
        prev_tag, prev_type = tag, type_
    return found


def prf(correct: float, predicted: float, gold: float) -> tuple[float, float, float]:
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def entity_scores(gold: Iterable[Sequence[str]], predicted: Iterable[Sequence[str]]) -> dict[str, float]:
    """Micro precision, recall and F1 over the entities of many sentences (lists of tags, one per word)."""
    counts = [0, 0, 0]  # correct, predicted, gold
    for gold_tags, predicted_tags in zip(gold, predicted, strict=True):
        if len(gold_tags) != len(predicted_tags):
            raise ValueError(f"a sentence has {len(gold_tags)} gold tags but {len(predicted_tags)} predicted")
        gold_entities, predicted_entities = set(entities(gold_tags)), set(entities(predicted_tags))
        counts[0] += len(gold_entities & predicted_entities)
        counts[1] += len(predicted_entities)
        counts[2] += len(gold_entities)
    precision, recall, f1 = prf(*counts)
    return {"precision": precision, "recall": recall, "f1": f1}


def entity_types(label_names: Sequence[str]) -> list[str]:
    """The entity types of a tag set, sorted: ["LOC", "MISC", "ORG", "PER"] for CoNLL-2003's nine tags."""
    return sorted({_split(t)[1] for t in label_names} - {""})


class EntityF1(Metric):
    """Entity-level micro F1 (and per-type F1) over sentences given as label-index sequences.

    `update(predicted, gold)` takes, per sentence, the word-level label indices; gold positions equal to
    `ignore_index` (padding) are dropped from both.
    """

    full_state_update = False

    def __init__(self, label_names: Sequence[str], ignore_index: int = IGNORE_INDEX):
        super().__init__()
        self.label_names = list(label_names)
        self.types = entity_types(label_names)
        self.ignore_index = ignore_index
        for name in ("correct", "predicted", "gold"):
            self.add_state(name, default=torch.zeros(len(self.types), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, predicted: torch.Tensor, gold: torch.Tensor) -> None:
        """`predicted`, `gold`: (sentences, words) label indices."""
        index = {t: i for i, t in enumerate(self.types)}
        correct, predicted_counts, gold_counts = ([0] * len(self.types) for _ in range(3))
        for predicted_row, gold_row in zip(predicted.tolist(), gold.tolist(), strict=True):
            keep = [i for i, g in enumerate(gold_row) if g != self.ignore_index]
            gold_entities = set(entities([self.label_names[gold_row[i]] for i in keep]))
            predicted_entities = set(entities([self.label_names[predicted_row[i]] for i in keep]))
            for kind, _, _ in gold_entities:
                gold_counts[index[kind]] += 1
            for kind, _, _ in predicted_entities:
                predicted_counts[index[kind]] += 1
            for kind, _, _ in gold_entities & predicted_entities:
                correct[index[kind]] += 1
        for state, values in ((self.correct, correct), (self.predicted, predicted_counts), (self.gold, gold_counts)):
            state += torch.tensor(values, dtype=torch.long, device=state.device)

    def compute(self) -> dict[str, torch.Tensor]:
        precision, recall, f1 = prf(self.correct.sum().item(), self.predicted.sum().item(), self.gold.sum().item())
        scores = {"precision": precision, "recall": recall, "f1": f1}
        for i, kind in enumerate(self.types):
            scores[f"f1_{kind}"] = prf(self.correct[i].item(), self.predicted[i].item(), self.gold[i].item())[2]
        return {name: torch.tensor(value) for name, value in scores.items()}


class WordAccuracy(Metric):
    """The share of words whose predicted label is the gold one; gold positions equal to `ignore_index` (padding)
    are left out. Counts add up over batches and devices."""

    full_state_update = False

    def __init__(self, ignore_index: int = IGNORE_INDEX):
        super().__init__()
        self.ignore_index = ignore_index
        self.add_state("correct", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("words", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, predicted: torch.Tensor, gold: torch.Tensor) -> None:
        real = gold != self.ignore_index
        self.correct += (predicted.eq(gold) & real).sum()
        self.words += real.sum()

    def compute(self) -> dict[str, torch.Tensor]:
        return {"word_accuracy": self.correct.float() / self.words.clamp(min=1)}


def word_accuracy(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> float:
    pairs = [
        (g, p)
        for gold_tags, predicted_tags in zip(gold, predicted, strict=True)
        for g, p in zip(gold_tags, predicted_tags, strict=True)
    ]
    return sum(g == p for g, p in pairs) / max(1, len(pairs))


@dataclass
class ConllevalFiles:
    """NER's `PredictionWriter`: per prediction split `<split>.txt` in conlleval's input format (word, gold tag,
    predicted tag; a blank line between sentences; "_" for a word cut off from a tag set without "O") and eval.json
    with the word accuracy of every split, and its entity-level scores when the tags mark entities.

    `data[split]` holds each sentence's `idx`, `tokens` (its words) and `word_labels` (gold label indices).
    """

    label_names: Sequence[str]
    data: dict[str, datasets.Dataset]

    def write(self, predictions: Predictions, out_dir: Path) -> list[Path]:
        written, scores = [], {}
        for split, by_idx in predictions.items():
            sentences = self.data[split]
            gold, predicted, lines = [], [], []
            for idx, words, labels in zip(sentences["idx"], sentences["tokens"], sentences["word_labels"], strict=True):
                gold_tags = [self.label_names[i] for i in labels]
                predicted_tags = [self.label_names[i] if i != NO_TAG else "_" for i in by_idx[idx][: len(words)]]
                gold.append(gold_tags)
                predicted.append(predicted_tags)
                lines += [f"{w} {g} {p}" for w, g, p in zip(words, gold_tags, predicted_tags, strict=True)] + [""]
            written.append(write_atomically(out_dir / f"{split}.txt", "\n".join(lines)))
            scores[split] = {"word_accuracy": word_accuracy(gold, predicted)}
            if has_entities(self.label_names):
                scores[split] |= entity_scores(gold, predicted)
        return [*written, write_atomically(out_dir / "eval.json", json.dumps(scores, indent=2) + "\n")]

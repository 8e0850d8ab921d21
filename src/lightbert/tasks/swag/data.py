"""SWAG (Zellers et al. 2018) for multiple-choice fine-tuning (paper §4.4): which of four endings follows a sentence.

Data comes from the hub (`allenai/swag`, config `regular`) or from local files with its columns, one per split
(`task.data_files.<split>=PATH`; csv, tsv, json, jsonl or parquet): `sent1` (the given sentence), `sent2` (the
start of the next one), `ending0` ... `ending3` and `label` (0-3). Each choice is the pair
`[CLS] sent1 [SEP] sent2 ending_i [SEP]`, as in the paper (sentence A the context, sentence B a continuation) and
Hugging Face's run_swag, truncated longest-first to `max_seq_length`. The hidden test set is not predicted.
"""

from __future__ import annotations

import datasets
import torch

from lightbert.data.batches import pad_batch
from lightbert.data.encoding import encode_truncated
from lightbert.data.tokenizer import BertTokenizer
from lightbert.errors import UserError
from lightbert.tasks.finetuning.datamodule import FineTuningDataModule

HUB_DATASET, HUB_CONFIG = "allenai/swag", "regular"
NUM_CHOICES = 4
ENDINGS = tuple(f"ending{i}" for i in range(NUM_CHOICES))
COLUMNS = ("sent1", "sent2", *ENDINGS, "label")


def continuations(start: str | None, endings: list[str | None]) -> list[str]:
    """Sentence B of each choice: the start of the next sentence, then the ending."""
    return [f"{'' if start is None else start} {'' if ending is None else ending}".strip() for ending in endings]


def encode_choice_pairs(
    context: list[int], continued: list[list[int]], tokenizer: BertTokenizer, max_seq_length: int
) -> tuple[list[list[int]], list[list[int]], bool]:
    """Each choice's (input_ids, token_type_ids), cut longest-first; and whether any was cut."""
    pairs = [encode_truncated(context, c, max_seq_length, tokenizer.cls_id, tokenizer.sep_id) for c in continued]
    cut = any(len(context) + len(c) > max_seq_length - 3 for c in continued)
    return [ids for ids, _ in pairs], [types for _, types in pairs], cut


def encode_choices(batch: dict, tokenizer: BertTokenizer, max_seq_length: int) -> dict:
    """Per example, NUM_CHOICES (input_ids, token_type_ids) pairs: the context, then sent2 + the ending."""
    contexts = tokenizer.encode_batch(["" if s is None else str(s) for s in batch["sent1"]])
    input_ids, token_type_ids, cut, empty = [], [], [], []
    for i, context in enumerate(contexts):
        endings = [batch[e][i] for e in ENDINGS]
        continued = tokenizer.encode_batch(continuations(batch["sent2"][i], endings))
        ids, types, was_cut = encode_choice_pairs(context, continued, tokenizer, max_seq_length)
        empty.append(sum(not (ending or "").strip() for ending in endings))
        cut.append(was_cut)
        input_ids.append(ids)
        token_type_ids.append(types)
    # What a user must be told (counted by SwagDataModule.encode): examples cut, endings without text.
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "cut": cut, "empty": empty}


def choice_label(label: object, row: int, where: str) -> dict:
    """The right ending's index, 0-3: as a number, or as digits (a column with an empty cell is read as text)."""
    if (isinstance(label, str) and label.strip().isdigit()) or (isinstance(label, float) and label.is_integer()):
        label = int(label)
    if isinstance(label, bool) or label not in range(NUM_CHOICES):
        raise UserError(f"{where}, row {row + 1}: label must be 0-{NUM_CHOICES - 1}, not {label!r}")
    return {"label": label}


class ChoiceCollator:
    """(B, C, T) inputs: every choice of every example padded to the batch's longest."""

    def __init__(self, pad_id: int, pad_to_multiple_of: int | tuple[int, ...] | None = 8):
        self.pad_id, self.pad_to_multiple_of = pad_id, pad_to_multiple_of

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        flat = [
            {"input_ids": ids, "token_type_ids": types}
            for row in rows
            for ids, types in zip(row["input_ids"], row["token_type_ids"], strict=True)
        ]
        batch = pad_batch(flat, self.pad_id, self.pad_to_multiple_of)
        batch = {k: v.view(len(rows), NUM_CHOICES, -1) for k, v in batch.items()}
        batch["labels"] = torch.tensor([r["label"] for r in rows], dtype=torch.long)
        batch["idx"] = torch.tensor([r["idx"] for r in rows], dtype=torch.long)
        return batch


class SwagDataModule(FineTuningDataModule):
    """SWAG's four-way choices; the hidden test set is not predicted."""

    name = family = "swag"
    hub_dataset, hub_config = HUB_DATASET, HUB_CONFIG

    def required_columns(self, split: str) -> tuple[str, ...]:
        return COLUMNS

    def check(self, raw: datasets.Dataset, split: str, where: str) -> datasets.Dataset:
        return raw.map(choice_label, input_columns=["label"], with_indices=True, fn_kwargs={"where": where})

    def encode(self, raw: datasets.Dataset, split: str, where: str) -> dict[str, datasets.Dataset]:
        encoded = raw.map(
            encode_choices,
            batched=True,
            remove_columns=[c for c in raw.column_names if c != "label"],
            fn_kwargs={"tokenizer": self.tokenizer, "max_seq_length": self.max_seq_length},
            load_from_cache_file=False,  # cached as a whole by the base
            desc=f"Tokenizing SWAG {split}",
        )
        self.note(where, sum(encoded["cut"]), f"examples were cut to max_seq_length={self.max_seq_length} tokens")
        self.note(where, sum(encoded["empty"]), "endings are empty: the model sees the context alone for them")
        encoded = encoded.remove_columns(["cut", "empty"])
        return {split: encoded.add_column("idx", list(range(len(encoded))))}

    def collator(self, train: bool) -> ChoiceCollator:
        return ChoiceCollator(self.tokenizer.pad_id, self.pad_to_multiple_of)

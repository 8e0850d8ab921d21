"""SWAG (Zellers et al. 2018) for multiple-choice fine-tuning (paper §4.4): which of four endings follows a sentence.

Data comes from the hub (`allenai/swag`, config `regular`) or from local files with its columns, one per split
(`task.data_files.<split>=PATH`; csv, tsv, json, jsonl or parquet): `sent1` (the given sentence), `sent2` (the
start of the next one), `ending0` ... `ending3` and `label` (0-3). Each choice is the pair
`[CLS] sent1 [SEP] sent2 ending_i [SEP]`, as in the paper (sentence A the context, sentence B a continuation) and
Hugging Face's run_swag, truncated longest-first to `max_seq_length`. The hidden test set is not predicted.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import datasets
import torch
from torch.utils.data import DataLoader

from lightbert.data.batches import pad_batch
from lightbert.data.finetuning import FineTuningDataModule
from lightbert.data.glue import truncate_pair
from lightbert.data.local_files import check_data_files, progress_bars_for, read_hub, read_local, save_cache
from lightbert.data.tokenizer import BertTokenizer
from lightbert.errors import UserError

CACHE_VERSION = 1
HUB_DATASET, HUB_CONFIG = "allenai/swag", "regular"
NUM_CHOICES = 4
ENDINGS = tuple(f"ending{i}" for i in range(NUM_CHOICES))
COLUMNS = ("sent1", "sent2", *ENDINGS, "label")
SPLITS = ("train", "validation")


def encode_choices(batch: dict, tokenizer: BertTokenizer, max_seq_length: int) -> dict:
    """Per example, NUM_CHOICES (input_ids, token_type_ids) pairs: the context, then sent2 + the ending."""
    contexts = tokenizer.encode_batch([s or "" for s in batch["sent1"]])
    input_ids, token_type_ids = [], []
    for i, context in enumerate(contexts):
        starts = batch["sent2"][i] or ""
        continuations = tokenizer.encode_batch([f"{starts} {batch[e][i] or ''}".strip() for e in ENDINGS])
        ids, types = [], []
        for continuation in continuations:
            a, b = truncate_pair(context, continuation, max_seq_length - 3)
            ids.append([tokenizer.cls_id, *a, tokenizer.sep_id, *b, tokenizer.sep_id])
            types.append([0] * (len(a) + 2) + [1] * (len(b) + 1))
        input_ids.append(ids)
        token_type_ids.append(types)
    return {"input_ids": input_ids, "token_type_ids": token_type_ids}


class ChoiceCollator:
    """(B, C, T) inputs: every choice of every example padded to the batch's longest."""

    def __init__(self, pad_id: int, pad_to_multiple_of: int | None = 8):
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
    def __init__(
        self,
        cache_dir: str,
        tokenizer: BertTokenizer | None = None,
        tokenizer_path: str | None = None,
        data_files: dict[str, str] | None = None,
        hub_dataset: str = HUB_DATASET,
        max_seq_length: int = 128,
        batch_size: int = 16,
        eval_batch_size: int | None = None,
        num_workers: int = 2,
        pad_to_multiple_of: int | None = 8,
    ):
        super().__init__(
            "swag",
            cache_dir,
            tokenizer,
            tokenizer_path,
            data_files,
            hub_dataset,
            batch_size,
            eval_batch_size,
            num_workers,
            pad_to_multiple_of,
        )
        if max_seq_length < 8:
            raise UserError(f"task.max_seq_length must be at least 8, got {max_seq_length}")
        self.max_seq_length = max_seq_length
        check_data_files(self.data_files, SPLITS, SPLITS, "swag")

    def _load_raw(self, split: str) -> datasets.Dataset:
        if self.data_files:
            file = Path(self.data_files[split]).expanduser()
            where = f"task.data_files.{split} ({file})"
            raw = read_local(file, self.cache_dir, where)
        else:
            where = f"{self.hub_dataset}/{HUB_CONFIG} [{split}]"
            raw = read_hub(self.hub_dataset, HUB_CONFIG, split, SPLITS, where)
        missing = [c for c in COLUMNS if c not in raw.column_names]
        if missing:
            raise UserError(
                f"{where} lacks the column(s) {missing}; SWAG needs {list(COLUMNS)}, it has {raw.column_names}"
            )
        if len(raw) == 0:
            raise UserError(f"{where} has no rows")
        bad = [(i, label) for i, label in enumerate(raw["label"]) if label not in range(NUM_CHOICES)]
        if bad:
            raise UserError(f"{where}: label must be 0-{NUM_CHOICES - 1}; rows (row, label) {bad[:5]} are not")
        return raw

    @cached_property
    def cached_dir(self) -> Path:
        return self.cache_dir / "swag" / self.cache_key([CACHE_VERSION, self.max_seq_length], SPLITS, HUB_CONFIG)

    def prepare_data(self) -> None:
        if (self.cached_dir / "dataset_dict.json").is_file():
            return
        parts = {}
        for split in SPLITS:
            raw = self._load_raw(split)
            with progress_bars_for(len(raw)):
                encoded = raw.map(
                    encode_choices,
                    batched=True,
                    remove_columns=[c for c in raw.column_names if c != "label"],
                    fn_kwargs={"tokenizer": self.tokenizer, "max_seq_length": self.max_seq_length},
                    load_from_cache_file=False,  # cached as a whole below
                    desc=f"Tokenizing SWAG {split}",
                )
            parts[split] = encoded.add_column("idx", list(range(len(encoded))))
        save_cache(parts, self.cached_dir)

    def _loader(self, split: str, train: bool = False) -> DataLoader:
        assert self.datasets is not None, "call setup() first"
        collator = ChoiceCollator(self.tokenizer.pad_id, self.pad_to_multiple_of)
        return self.loader(self.datasets[split], collator, train)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("validation")

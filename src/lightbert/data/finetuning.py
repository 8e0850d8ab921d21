"""What the fine-tuning DataModules (GLUE, SQuAD, SWAG, CoNLL) share: the tokenizer a checkpoint brought, data from
local files or the hub, a cache of tokenised splits keyed by everything that made them, and the loaders."""

from __future__ import annotations

import hashlib
from functools import cached_property
from pathlib import Path

import datasets
import lightning as L
from torch.utils.data import DataLoader

from lightbert.data.batches import make_loader
from lightbert.data.corpus import digest, file_identity
from lightbert.data.local_files import require_tokenizer
from lightbert.data.tokenizer import BertTokenizer, load_tokenizer


class FineTuningDataModule(L.LightningDataModule):
    """Subclasses tokenise in `prepare_data` (saving under `cached_dir`) and build loaders with `loader`."""

    def __init__(
        self,
        task: str,
        cache_dir: str,
        tokenizer: BertTokenizer | None,
        tokenizer_path: str | None,
        data_files: dict[str, str] | None,
        hub_dataset: str,
        batch_size: int,
        eval_batch_size: int | None,
        num_workers: int,
        pad_to_multiple_of: int | None,
    ):
        super().__init__()
        require_tokenizer(tokenizer, tokenizer_path, task)
        self._tokenizer, self.tokenizer_path = tokenizer, tokenizer_path
        self.cache_dir = Path(cache_dir).expanduser()
        self.data_files = {k: str(v) for k, v in (data_files or {}).items() if v}
        self.hub_dataset = hub_dataset
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.num_workers, self.pad_to_multiple_of = num_workers, pad_to_multiple_of
        self.datasets: datasets.DatasetDict | None = None

    @cached_property
    def tokenizer(self) -> BertTokenizer:
        return self._tokenizer or load_tokenizer(self.tokenizer_path)

    def cache_key(self, settings: list, splits: tuple[str, ...], hub_config: str | None = None) -> str:
        """A digest of the settings, the tokenizer and each split's source (a file's identity, or the hub's name):
        the cache is rebuilt when any of them changes."""
        sources = {
            split: file_identity(Path(self.data_files[split]).expanduser())
            if self.data_files
            else [self.hub_dataset, hub_config, split]
            for split in splits
        }
        tokenizer = hashlib.sha256(self.tokenizer.backend.to_str().encode()).hexdigest()
        return digest([*settings, tokenizer, sources])

    def setup(self, stage: str | None = None) -> None:
        if self.datasets is None:
            self.datasets = datasets.load_from_disk(str(self.cached_dir))

    def loader(self, dataset: datasets.Dataset, collate_fn, train: bool = False) -> DataLoader:
        batch_size = self.batch_size if train else self.eval_batch_size
        return make_loader(dataset, collate_fn, batch_size, train, self.num_workers)

"""Pre-training corpora: where documents (lists of sentences) come from.

Every corpus gives a `datasets.Dataset` with one column, `sentences` (list of str), one row per document,
and a `fingerprint` that changes when its content may have changed, so caches built from it are rebuilt. The
corpora of BERT-format files (`text`, `demo`) also give their `files`, which the cached examples are tokenized from
as they are read (`byte_shares`, one share per process): the cache holds no copy of the text.

- `TextCorpus`: local files in the original BERT format, one sentence per line, blank line between documents.
- `HFCorpus`: a Hugging Face dataset (hub name, or a local builder such as `json`/`parquet` with
  `data_files`), one row per document, split into sentences with `lightbert.tasks.pretraining.sentences`.
- `DemoCorpus`: real English text that needs no network: the Python documentation that ships with every
  CPython (`pydoc_data.topics`, the language reference) and the docstrings of the standard library,
  written once to a BERT-format file in the cache. Nothing third-party is committed.
"""

from __future__ import annotations

import ast
import glob
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import datasets

from lightbert.data.local_files import (
    conversion_advice,
    digest,
    file_identity,
    nul_run,
    progress_bars_for,
    wide_encoding,
)
from lightbert.errors import UserError
from lightbert.files import open_atomically
from lightbert.hub import hub_reachable
from lightbert.tasks.pretraining.sentences import split_document, split_sentences


class TextCorpus:
    """Local BERT-format text files."""

    def __init__(self, paths: list[str] | str):
        if isinstance(paths, str):
            paths = [paths]
        if not paths:
            raise UserError("corpus.paths is empty; give the corpus files, e.g. corpus.paths=[data/wiki.txt]")
        self.paths = []
        for given in paths:
            path = Path(given).expanduser()
            if glob.has_magic(str(path)):  # a pattern the shell did not expand (it was quoted, or in a list)
                matches = sorted(Path(p) for p in glob.glob(str(path)) if Path(p).is_file())
                if not matches:
                    raise UserError(f"corpus.paths: the pattern {given} matches no file")
                self.paths += matches
            elif path.is_dir():
                raise UserError(
                    f"corpus.paths: {path} is a directory; give its files, e.g. corpus.paths=[{path}/*.txt]"
                )
            else:
                self.paths.append(path)
        for path in self.paths:
            if not path.is_file():
                raise UserError(
                    f"corpus file {path} does not exist; check corpus.paths (relative paths start "
                    f"from the directory you ran the command in: {Path.cwd()})"
                )
            if path.stat().st_size == 0:
                raise UserError(
                    f"corpus file {path} is empty; it needs sentences, one per line, with a blank "
                    "line between documents"
                )
            with path.open("rb") as handle:
                head = handle.read(4096)
            # Either decodes as UTF-8 without an error, to text of NUL characters.
            if wide_encoding(head) is not None or nul_run(head):
                raise UserError(f"corpus file {path} is not UTF-8 text; {conversion_advice(path)}")

    @property
    def fingerprint(self) -> str:
        return digest(["text", [file_identity(p) for p in self.paths]])

    def documents(self) -> Iterator[list[str]]:
        for path in self.paths:
            yield from read_bert_format(path)

    def load(self, cache_dir: Path, num_proc: int | None = None) -> datasets.Dataset:
        return _dataset_from_documents(self.documents, self.fingerprint, cache_dir)

    def files(self, cache_dir: Path) -> list[Path]:
        """The BERT-format files, in order: what the examples are tokenized from, read in `byte_shares`."""
        return self.paths

    def stream(self, cache_dir: Path, shard: tuple[int, int] | None = None) -> Iterator[list[str]]:
        """The documents read one at a time, nothing cached (task.datamodule.streaming=true); with `shard` (index,
        count), only that reader's share, read from its own files or byte ranges."""
        return read_shard(self.paths, shard)


def read_bert_format(path: Path, start: int = 0, stop: int | None = None) -> Iterator[list[str]]:
    """Documents of one BERT-format file: a sentence per line, documents separated by blank lines.

    With `start` and `stop`, only the documents whose first line follows a line break at a byte offset in
    [start, stop), the file's start counting as one at 0: ranges that tile the file give every document once, each
    read by the range it begins in, and a range reads little more than its own bytes (the document it ends in).
    """
    document: list[str] = []
    owned = start == 0  # whether the document being read is this range's
    blank_at: int | None = 0 if start == 0 else None  # offset of the last blank line seen, the file's start first
    with open(path, "rb") as f:
        position = 0
        if start > 0:  # to the first line that starts at or after `start`, without decoding the partial one
            f.seek(start - 1)
            position = start - 1 + len(f.readline())
        for line_number, raw in enumerate(f, 1):
            line_start, position = position, position + len(raw)
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError as error:
                where = f"line {line_number}" if start == 0 else f"the line at byte {line_start}"
                raise UserError(
                    f"corpus file {path} is not UTF-8 text ({where}: {error.reason} at byte {error.start}); "
                    f"{conversion_advice(path)}"
                ) from None
            if not line:
                if document and owned:
                    yield document
                document, owned, blank_at = [], False, line_start
                continue
            if not document:  # a document begins: this range's if the break before it lies in the range
                if blank_at is not None and stop is not None and blank_at >= stop:
                    return
                owned = blank_at is not None
                blank_at = None
            document.append(line)
    if document and owned:
        yield document


def read_shard(paths: list[Path], shard: tuple[int, int] | None) -> Iterator[list[str]]:
    """The documents of BERT-format files; with `shard` (index, count) only that share: whole files when there are
    at least as many files as shards, else the same byte range of every file."""
    index, count = shard or (0, 1)
    if len(paths) >= count:
        for path in paths[index::count]:
            yield from read_bert_format(path)
        return
    for path in paths:
        size = path.stat().st_size
        yield from read_bert_format(path, size * index // count, size * (index + 1) // count)


Piece = tuple[Path, int, int]  # a file's bytes [start, stop)


def byte_shares(paths: list[Path], count: int) -> list[list[Piece]]:
    """The files cut into `count` contiguous shares of about equal bytes, each a list of (path, start, stop) pieces:
    read share after share (`read_pieces`), they give every document once, in the files' order, whatever `count`
    (`read_bert_format` reads a document in the range it begins in)."""
    sizes = [path.stat().st_size for path in paths]
    total, shares = sum(sizes), []
    for index in range(count):
        low, high = total * index // count, total * (index + 1) // count
        pieces, offset = [], 0
        for path, size in zip(paths, sizes, strict=True):
            start, stop = max(low - offset, 0), min(high - offset, size)
            if start < stop:
                pieces.append((path, start, stop))
            offset += size
        shares.append(pieces)
    return shares


def read_pieces(pieces: list[Piece]) -> Iterator[list[str]]:
    """The documents of a share of `byte_shares`."""
    for path, start, stop in pieces:
        yield from read_bert_format(path, start, stop)


def check_has_documents(documents: Iterator[list[str]]) -> None:
    """Refuses a corpus whose every line is blank, in one line (the first document read, if any)."""
    if next(iter(documents), None) is None:  # datasets would say `Instruction "train" corresponds to no data!`
        raise UserError(
            "the corpus has 0 usable documents: every line of it is blank. Pre-training needs text: sentences, one "
            "per line, with a blank line between documents (corpus.paths)"
        )


def _dataset_from_documents(documents, fingerprint: str, cache_dir: Path) -> datasets.Dataset:
    check_has_documents(documents())

    def generate(fingerprint: str):  # the fingerprint argument keys the datasets cache on the content
        for document in documents():
            yield {"sentences": document}

    try:
        return datasets.Dataset.from_generator(
            generate,
            gen_kwargs={"fingerprint": fingerprint},
            features=datasets.Features({"sentences": datasets.Sequence(datasets.Value("string"))}),
            cache_dir=str(cache_dir / "corpora"),
        )
    except datasets.exceptions.DatasetGenerationError as error:
        cause = error.__cause__ or error.__context__
        if isinstance(cause, UserError):
            raise cause from None
        raise


class HFCorpus:
    """A Hugging Face dataset with a text column; each row is a document."""

    def __init__(
        self,
        name: str,
        text_column: str = "text",
        config: str | None = None,
        split: str = "train",
        data_files: str | list[str] | dict | None = None,
        revision: str | None = None,
    ):
        if not name:
            raise UserError(
                "corpus.name is empty; give a dataset, e.g. corpus.name=wikimedia/wikipedia "
                "corpus.config=20231101.en, or corpus.name=json corpus.data_files=[my.jsonl]"
            )
        self.name, self.config, self.split, self.text_column = name, config, split, text_column
        self.data_files, self.revision = data_files, revision

    @property
    def fingerprint(self) -> str:
        files = self.data_files
        if files is not None:
            listed = [files] if isinstance(files, str) else files
            if not isinstance(listed, dict):
                # A pattern stands for the files it matches now: their identities are the key, not the pattern.
                files = [
                    [file_identity(Path(m)) for m in sorted(glob.glob(str(Path(p).expanduser())))] or p
                    if glob.has_magic(str(p))
                    else (file_identity(Path(p)) if Path(p).is_file() else p)
                    for p in listed
                ]
        return digest(["hf", self.name, self.config, self.split, self.text_column, files, self.revision])

    def _load_dataset(self, cache_dir: Path, streaming: bool) -> datasets.Dataset | datasets.IterableDataset:
        if not self.data_files:  # the hub's dataset, not local files through a builder (json, parquet, csv)
            hub_reachable()
        try:
            return datasets.load_dataset(
                self.name,
                self.config,
                split=self.split,
                data_files=self.data_files,
                revision=self.revision,
                cache_dir=str(cache_dir / "hf"),
                streaming=streaming,
            )
        except FileNotFoundError as error:
            raise UserError(f"could not load corpus {self.name!r} (split {self.split!r}): {error}") from None
        except (ConnectionError, OSError) as error:
            raise UserError(
                f"could not reach dataset {self.name!r} on the hub ({error}); without a network, "
                "use corpus=text or corpus.name=json corpus.data_files=[...]"
            ) from None

    def _check_text_column(self, columns) -> None:
        if self.text_column not in columns:
            raise UserError(
                f"corpus {self.name!r} has no column {self.text_column!r}; its columns are "
                f"{sorted(columns)}: set corpus.text_column to the one that holds the text"
            )

    def load(self, cache_dir: Path, num_proc: int | None = None) -> datasets.Dataset:
        raw = self._load_dataset(cache_dir, streaming=False)
        self._check_text_column(raw.column_names)
        with progress_bars_for(len(raw)):
            return raw.map(
                _split_rows,
                batched=True,
                input_columns=[self.text_column],
                remove_columns=raw.column_names,
                num_proc=num_proc if num_proc and len(raw) >= 1000 else None,
                desc="Splitting documents into sentences",
            )

    def stream(self, cache_dir: Path, shard: tuple[int, int] | None = None) -> Iterator[list[str]]:
        """The rows read one at a time with `streaming=True`, each split into sentences; nothing downloaded whole.
        With `shard` (index, count), only that reader's rows: its own files of the dataset where it has a multiple of
        `count` of them (`datasets.distributed.split_dataset_by_node`), else every count-th row of the stream."""
        rows = self._load_dataset(cache_dir, streaming=True)
        if shard is not None and shard[1] > 1:
            from datasets.distributed import split_dataset_by_node

            rows = split_dataset_by_node(rows, rank=shard[0], world_size=shard[1])
        # iter() rather than __iter__: inside a DataLoader worker the latter would shard by worker itself, and
        # lightbert.tasks.pretraining.streaming already gives each worker its own documents.
        for batch in rows.iter(batch_size=256):
            self._check_text_column(batch)
            for text in batch[self.text_column]:
                yield split_document(text or "")


def _split_rows(texts: list[str | None]) -> dict:
    return {"sentences": [split_document(text or "") for text in texts]}


class DemoCorpus:
    """The Python documentation shipped with this interpreter, as a BERT-format corpus built at first use."""

    VERSION = 1  # bump when the extraction below changes, so cached copies are rebuilt

    @property
    def fingerprint(self) -> str:
        return digest(["demo", self.VERSION, sys.version_info[:2]])

    def path(self, cache_dir: Path) -> Path:
        return cache_dir / "demo" / f"python{sys.version_info[0]}{sys.version_info[1]}-docs-v{self.VERSION}.txt"

    def build(self, cache_dir: Path) -> Path:
        path = self.path(cache_dir)
        if path.is_file():
            return path
        with open_atomically(path) as f:
            for document in python_documentation():
                f.write("\n".join(document) + "\n\n")
        return path

    def load(self, cache_dir: Path, num_proc: int | None = None) -> datasets.Dataset:
        path = self.build(cache_dir)
        return _dataset_from_documents(lambda: read_bert_format(path), self.fingerprint, cache_dir)

    def files(self, cache_dir: Path) -> list[Path]:
        return [self.build(cache_dir)]

    def stream(self, cache_dir: Path, shard: tuple[int, int] | None = None) -> Iterator[list[str]]:
        return read_shard([self.build(cache_dir)], shard)


def _prose_sentences(text: str) -> list[str]:
    """Sentences from the prose paragraphs of reStructuredText-ish documentation; code and tables dropped."""
    sentences = []
    for paragraph in text.split("\n\n"):
        lines = [line for line in paragraph.splitlines() if line.strip()]
        if not lines or any(line.lstrip().startswith((">>>", "...", "|", "+-", "::")) for line in lines):
            continue
        indents = {len(line) - len(line.lstrip()) for line in lines}
        if len(indents) > 1 and min(indents) == 0:  # a definition list or code under a heading, not prose
            continue
        for sentence in split_sentences(" ".join(line.strip() for line in lines)):
            words = sentence.split()
            letters = sum(c.isalpha() for c in sentence)
            if len(words) >= 4 and letters >= 0.6 * len(sentence) and not sentence.endswith(":"):
                sentences.append(sentence)
    return sentences


def stdlib_docstrings() -> Iterator[tuple[str, list[str]]]:
    """Each module of CPython's standard library (tests and vendored packages left out) as its path below the
    library's folder and the docstrings of the module, its classes and its functions, in `ast.walk`'s order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        relative = path.relative_to(stdlib).parts
        if any(part in {"test", "tests", "site-packages", "idle_test", "lib2to3"} for part in relative):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        nodes = (
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        )
        yield "/".join(relative), [d for d in map(ast.get_docstring, nodes) if d]


def python_documentation() -> Iterator[list[str]]:
    """Documents of English prose from CPython itself: reference topics, then standard-library docstrings."""
    from pydoc_data.topics import topics

    for name in sorted(topics):
        document = _prose_sentences(topics[name])
        if len(document) >= 2:
            yield document

    for _, docstrings in stdlib_docstrings():
        document = [sentence for docstring in docstrings for sentence in _prose_sentences(docstring)]
        if len(document) >= 4:
            yield document


CORPORA = {"text": TextCorpus, "hf": HFCorpus, "demo": DemoCorpus}
Corpus = TextCorpus | HFCorpus | DemoCorpus

"""Task data from local files, one per split (`task.data_files.<split>=PATH`), and from the Hugging Face hub."""

from __future__ import annotations

import csv
import errno
import hashlib
import json
import logging
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import datasets

from lightbert.errors import UserError
from lightbert.files import publish_directory
from lightbert.hub import hub_reachable

log = logging.getLogger(__name__)

LOCAL_FORMATS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}

# Byte-order marks of the wide Unicode encodings, longest first (UTF-32LE's begins with UTF-16LE's).
WIDE_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32LE"), (b"\x00\x00\xfe\xff", "UTF-32BE"),
    (b"\xff\xfe", "UTF-16LE"), (b"\xfe\xff", "UTF-16BE"),
)  # fmt: skip


def wide_encoding(head: bytes) -> tuple[str, str] | None:
    """(encoding, iconv's name for reading it) when the first bytes of a file are UTF-16 or UTF-32, else None: by
    the byte-order mark (iconv's UTF-16 reads the mark and drops it), or without one (Windows' "Unicode" text saved
    without a mark) by the NUL bytes that every ASCII character carries there. UTF-8 and Latin-1 text hold no NUL
    byte, so advice to convert from Latin-1 would be wrong for it."""
    for bom, name in WIDE_BOMS:
        if head.startswith(bom):
            return name, name[:6]
    sample = head[: len(head) - len(head) % 4]
    if len(sample) < 4 or sample.count(0) < len(sample) // 4:
        return None
    for width, name in ((4, "UTF-32"), (2, "UTF-16")):  # ASCII in the low byte: NULs at fixed places of each unit
        for order, zeros in (("LE", range(1, width)), ("BE", range(width - 1))):
            if all(sample[i + z] == 0 for i in range(0, len(sample), width) for z in zeros):
                return name + order, name + order
    if nul_run(head):  # a run of NULs is no wide text's (UTF-32 puts at most 3 in a row): padding after the text
        return None
    return "UTF-16 or UTF-32", "UTF-16"


def nul_run(head: bytes) -> bool:
    """Whether the bytes hold a run of 4 NULs or more, which no UTF-8, UTF-16 or UTF-32 text has (but for NUL
    characters): the padding a crash or a preallocated file leaves after the text."""
    return b"\0\0\0\0" in head


def conversion_advice(path: Path) -> str:
    """How to make `path` UTF-8: iconv from the wide encoding its first bytes show, else from Latin-1 (the commonest
    8-bit encoding)."""
    with path.open("rb") as handle:
        head = handle.read(4096)
    wide = wide_encoding(head)
    if wide is None and nul_run(head):
        # Converting from another encoding would keep the NULs (and garble the UTF-8 before them): remove them.
        return (
            f"it holds runs of NUL bytes ({head.count(0)} in its first {len(head)} bytes: padding after the text?); "
            f"remove them, e.g. `tr -d '\\000' < {path.name} > {path.stem}.clean{path.suffix}`"
        )
    source = wide[1] if wide else "latin1"
    found = f"it is {wide[0]} text; " if wide else ""
    return f"{found}convert it, e.g. `iconv -f {source} -t utf-8 {path.name} > {path.stem}.utf8{path.suffix}`"


def check_data_files(
    data_files: dict[str, str],
    required: tuple[str, ...],
    known: tuple[str, ...],
    task: str,
    formats: tuple[str, ...] | None = tuple(LOCAL_FORMATS),
) -> None:
    """Every required split has a file, every split is known, every file exists (with a suffix in `formats`,
    unless `formats` is None: any file)."""
    if not data_files:
        return
    unknown = sorted(set(data_files) - set(known))
    if unknown:
        raise UserError(f"task.data_files has unknown split(s) {unknown} for {task}; valid: {list(known)}")
    missing = [s for s in required if s not in data_files]
    if missing:
        raise UserError(
            f"task.data_files gives no file for the split(s) {missing}; {task} needs "
            + ", ".join(f"task.data_files.{s}=PATH" for s in required)
        )
    for split, path in data_files.items():
        file = Path(path).expanduser()
        if not file.is_file():
            raise UserError(f"task.data_files.{split}: {file} does not exist")
        if formats is not None and file.suffix.lower() not in formats:
            raise UserError(f"task.data_files.{split}: {file} has an unknown format; use one of {sorted(formats)}")


def read_local(file: Path, cache_dir: Path, where: str) -> datasets.Dataset:
    """One file as a Dataset, by its extension (csv, tsv, json, jsonl, parquet)."""
    suffix = file.suffix.lower()
    # Task text is full of quotes: read TSV cells verbatim, as the GLUE distribution's own readers do.
    options = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if suffix == ".tsv" else {}
    if suffix in (".csv", ".tsv"):
        # Text is text: "NA", "null", "None" or "n/a" in a sentence stay words (pandas would make them missing).
        options |= {"keep_default_na": False, "na_filter": False}
        check_table_shape(file, where)
    try:
        return datasets.load_dataset(
            LOCAL_FORMATS[suffix],
            data_files={"data": str(file)},
            split="data",
            cache_dir=str(cache_dir / "datasets"),
            **options,
        )
    except Exception as error:
        reason = cache_write_failure(error, cache_dir)  # the file may be fine: datasets converts it into the cache
        if reason is not None:
            raise cache_error(cache_dir / "datasets", reason) from None
        raise UserError(f"could not read {where}: {diagnose(file, error)}") from None


def check_table_shape(file: Path, where: str) -> None:
    """Every row of a CSV or TSV file has the header's number of cells: pandas would otherwise shift the columns of
    a file whose rows end in a tab (then "the label cell is empty"), or stop with no row named."""
    tsv = file.suffix.lower() == ".tsv"
    started = 1  # the line the row being read starts on (a quoted cell may span lines)
    limit = csv.field_size_limit(sys.maxsize)  # a cell of a whole book is text too (pandas has no such limit)
    try:
        with file.open(encoding="utf-8", newline="") as handle:
            options = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if tsv else {"strict": True}
            reader = csv.reader(handle, **options)
            header = next(reader, None)
            started = reader.line_num + 1
            for row in reader:
                if row and len(row) != len(header or []):
                    hint = "a tab at the end of the line, or inside a cell?" if tsv else "a comma in a cell not quoted?"
                    raise UserError(
                        f"could not read {where}: line {started} has {len(row)} cells and the header "
                        f"{len(header or [])} ({hint})"
                    )
                started = reader.line_num + 1
    except csv.Error as error:
        raise UserError(
            f"could not read {where}: line {started}: {error} (a quote opened there and never closed?)"
        ) from None
    except UnicodeDecodeError as error:
        raise UserError(f"could not read {where}: it is not UTF-8 text ({error}); {conversion_advice(file)}") from None
    finally:
        csv.field_size_limit(limit)


def diagnose(file: Path, error: Exception) -> str:
    """What is wrong with a file datasets could not read, with its line and column where there is one: datasets'
    own messages name neither (or say `Instruction "data" corresponds to no data!` for a file without rows)."""
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as bad:
        return f"it is not UTF-8 text ({bad}); {conversion_advice(file)}"
    lines = [line for line in text.splitlines() if line.strip()]
    suffix = file.suffix.lower()
    if not lines:
        return "the file is empty"
    if suffix in (".csv", ".tsv") and len(lines) == 1:
        return "it holds a header and no rows"
    if suffix in (".json", ".jsonl"):
        try:
            json.loads(text)
            return f"{type(error).__name__}: {error}"  # one JSON document that datasets still refused
        except json.JSONDecodeError:
            pass
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as bad:
                return f"line {number}, column {bad.colno}: not valid JSON ({bad.msg}); write one JSON object per line"
            try:
                json.dumps(record, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                return f"line {number} holds a lone surrogate (an escaped half of a character, e.g. \\ud800); fix it"
    return f"{type(error).__name__}: {error}"


def read_hub(name: str, config: str | None, split: str, required: tuple[str, ...], where: str) -> datasets.Dataset:
    """`where` names the source in messages; `required` lists the splits a user would give as local files."""
    hub_reachable()  # offline at once where the hub's host does not resolve, not after five retries
    try:
        return datasets.load_dataset(name, config, split=split)
    except Exception as error:
        raise UserError(
            f"could not load {where} from the Hugging Face hub ({type(error).__name__}); without a network, "
            "give local files: " + ", ".join(f"task.data_files.{s}=PATH" for s in required)
        ) from None


def require_tokenizer(tokenizer: object, tokenizer_path: str | None, task: str) -> None:
    """Fine-tuning starts from a pre-trained model, which brings its tokenizer."""
    if tokenizer is None and not tokenizer_path:
        raise UserError(
            f"task={task} fine-tunes a pre-trained model: set init_from=<checkpoint> (a lightbert .ckpt or "
            "run directory, a Hugging Face directory, or a hub id); its tokenizer comes with it"
        )


def save_cache(parts: dict[str, datasets.Dataset], cached_dir: Path, extra_files: dict[str, str] | None = None) -> None:
    """`parts` as a DatasetDict at `cached_dir` (plus small text files), all or nothing (`publish_directory`)."""

    def write(tmp: Path) -> None:
        datasets.DatasetDict(parts).save_to_disk(str(tmp))
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)

    if not cached_dir.exists():
        with cache_writes(cached_dir):
            publish_directory(cached_dir, write)


@contextmanager
def cache_writes(where: Path) -> Iterator[None]:
    """A cache that cannot be written (a full disk, a file-size limit, a read-only or foreign directory) is one
    message naming it and where to move it; `publish_directory` has already removed the half-written copy."""
    try:
        yield
    except UserError:
        raise
    except Exception as error:
        reason = cache_write_failure(error)
        if reason is None:
            raise
        raise cache_error(where, reason) from None


def cache_error(where: Path, reason: str) -> UserError:
    return UserError(
        f"could not write the cache {where}: {reason}. Free space there, or move the cache with paths.cache_dir=... "
        "(or the LIGHTBERT_CACHE environment variable)"
    )


WRITE_ERRORS = (errno.ENOSPC, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT)


def cache_write_failure(error: BaseException, cache: Path | None = None) -> str | None:
    """Why a write into the cache failed, where `error` is one (else None): an OSError of a failed write, itself or
    the one it was raised from (datasets wraps ENOSPC, met while it writes a split's Arrow file, in a
    DatasetGenerationError), or datasets' own check of the free space before it writes (an OSError without errno).
    With `cache`, an error naming a file outside it is not the cache's (a data file the user may not read)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        named = getattr(error, "filename", None)
        elsewhere = cache is not None and named and not Path(str(named)).resolve().is_relative_to(cache.resolve())
        if isinstance(error, OSError) and error.errno in WRITE_ERRORS and not elsewhere:
            return error.strerror
        if isinstance(error, OSError) and str(error).startswith("Not enough disk space"):
            return "No space left on device (too little for datasets to start writing)"
        error = error.__cause__ or error.__context__
    return None


def load_cached(cached_dir: Path, rebuild: Callable[[], None]) -> datasets.DatasetDict:
    """The cache entry at `cached_dir`; one that cannot be read (a truncated .arrow file, a broken
    dataset_dict.json: a disk that filled, a copy cut short) is removed, rebuilt once by `rebuild`, and said."""
    try:
        return datasets.load_from_disk(str(cached_dir))
    except Exception as error:  # datasets and Arrow raise many kinds for a damaged file
        log.warning(
            f"the cache entry {cached_dir} could not be read ({type(error).__name__}: {str(error)[:120]}); "
            "it is rebuilt"
        )
    shutil.rmtree(cached_dir, ignore_errors=True)
    rebuild()
    return datasets.load_from_disk(str(cached_dir))


# datasets' progress bars are worth watching from this many rows on; a map of a few thousand rows takes seconds.
PROGRESS_BAR_ROWS = 10_000


@contextmanager
def progress_bars_for(num_rows: int) -> Iterator[None]:
    """datasets' progress bars on for a map of at least PROGRESS_BAR_ROWS rows with a terminal to show them, off
    otherwise (the tiny maps of a quick run, or a log file under SLURM where bars are noise)."""
    from datasets.utils import logging as datasets_logging

    was_on = datasets_logging.is_progress_bar_enabled()
    if num_rows >= PROGRESS_BAR_ROWS and sys.stderr.isatty():
        datasets_logging.enable_progress_bar()
    else:
        datasets_logging.disable_progress_bar()
    try:
        yield
    finally:
        (datasets_logging.enable_progress_bar if was_on else datasets_logging.disable_progress_bar)()


def digest(obj: object) -> str:
    """A short stable hash of JSON-able values: the cache keys of corpora, tokenizers and examples."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_identity(path: Path) -> list:
    """Path, inode, size, modification and change times: a file's part of a cache key. The change time (ctime) is
    the system's own: a rewrite moves it even when the modification time is set back (`cp -p`, `rsync -a`), so an
    edited file never reuses a stale cache, without reading gigabytes to hash them."""
    stat = path.stat()
    return [str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]

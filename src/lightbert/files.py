"""Writing files so that nothing is ever half-written: every file and directory lightbert writes goes through here.

A file is written beside its destination under a temporary name (hidden, with host and process id, so that
processes on several nodes sharing a file system never write the same one) and renamed into place when complete:
rename is atomic on POSIX file systems, so a reader sees the old file or the new one, never a part. A write that
fails leaves no temporary file behind.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO

from lightbert.errors import UserError

# What a finished run leaves in its directory: written by lightbert.run.outputs, read by init_from=<run dir>
# (lightbert.checkpoints.reading) and by the sweep summary.
RESULTS_FILE = "results.json"


def readable_as_usual(path: Path) -> None:
    """The permissions a new file gets from the user's umask (rw-r--r-- under the usual 022), for a file a library
    wrote private (0600)."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def cannot_be_made(path: Path) -> str | None:
    """Why a directory cannot be made at `path` (it is made when first used): the nearest part of it that exists is a
    file, is not writable, or is on a read-only file system; None where it can. (`os.access` asks the system: it says
    a read-only file system is not writable even to root, for whom permissions are no obstacle.)"""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        read_only = os.statvfs(existing).f_flag & os.ST_RDONLY
        return f"{existing} is on a read-only file system" if read_only else f"{existing} is not writable"
    return None


def temporary_path(path: Path) -> Path:
    """Where `path` is written before it is renamed into place."""
    return path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")


@contextmanager
def open_atomically(path: str | Path, newline: str | None = None) -> Iterator[IO[str]]:
    """A text file to write `path` through; renamed into place when the block ends without an error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        with tmp.open("w", encoding="utf-8", newline=newline) as f:
            yield f
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomically(path: str | Path, text: str) -> Path:
    """`text` into `path`, all or nothing."""
    with open_atomically(path) as f:
        f.write(text)
    return Path(path)


def replace_atomically(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Calls `write(tmp)` to write a file by other means (torch.save, a tokenizer's save), then renames it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def publish_file_once(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Calls `write(tmp)`, then puts it at `path` unless another process put one there first: the first file
    published wins, whole, and every process then reads that one (a hard link never replaces)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        write(tmp)
        with suppress(FileExistsError):  # another process published first: theirs is the file
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def publish_directory(final: Path, write: Callable[[Path], None]) -> None:
    """Calls `write(tmp)` to fill a directory beside `final`, then renames it into place, all or nothing.

    An interrupted run leaves no half directory. Of several processes preparing the same data, on this node or on
    other nodes sharing the file system (`trainer.num_nodes>1`: local rank 0 of every node prepares), each writes
    its own temporary directory and whichever renames second drops its copy. `final` may exist if it is empty.
    """
    tmp = temporary_path(final)
    try:
        write(tmp)
        if final.is_dir() and not any(final.iterdir()):
            final.rmdir()
        try:
            tmp.rename(final)
        except OSError:
            if not final.exists():
                raise  # another process published the same data first, else a real error
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_input_text(input_file: str | Path) -> str:
    """A user's `input_file=` as text: one message if it is missing or not UTF-8."""
    path = Path(input_file).expanduser()
    if not path.is_file():
        raise UserError(f"input_file={input_file} does not exist")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise UserError(f"input_file={input_file} is not UTF-8 text ({error})") from None

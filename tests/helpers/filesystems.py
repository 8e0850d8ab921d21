"""Real file-system faults for the tests: a read-only mount, a mount point and a full disk, made with a small tmpfs.

The tests run as root here, where `chmod` stops no write: a read-only mount (or, for another user, a directory
without write permission) is what refuses one. A tmpfs of a few pages fills up for real (ENOSPC), as a disk does.
Mounting needs root (CAP_SYS_ADMIN); elsewhere the read-only place is a directory without write permission, and a
test that needs a full disk is skipped, saying why.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _mount(target: Path, options: str) -> bool:
    """A tmpfs at `target` with `options`; False where this process may not mount."""
    if os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True)
    return done.returncode == 0


def _unmount(target: Path) -> None:
    subprocess.run(["umount", "-l", str(target)], check=True, capture_output=True)


@contextmanager
def read_only_directory(path: Path) -> Iterator[Path]:
    """`path`, an empty directory no process may write into: a read-only tmpfs as root, else mode 0555."""
    path.mkdir(parents=True, exist_ok=True)
    if _mount(path, "ro,size=64k"):
        try:
            yield path
        finally:
            _unmount(path)
        return
    if os.geteuid() == 0:
        pytest.skip("a read-only place needs a mount here (root ignores permissions), and mount is not permitted")
    path.chmod(0o555)
    try:
        yield path
    finally:
        path.chmod(0o755)


@contextmanager
def mount_point(path: Path) -> Iterator[Path]:
    """`path`, an empty writable file system's mount point (a small tmpfs): a directory that cannot be removed or
    renamed onto."""
    path.mkdir(parents=True, exist_ok=True)
    if not _mount(path, "size=64k"):
        pytest.skip("a mount point needs a tmpfs mount, which needs root")
    try:
        yield path
    finally:
        _unmount(path)


@contextmanager
def full_disk(path: Path, free: int = 0) -> Iterator[Path]:
    """`path`, an empty directory on a file system with `free` bytes left (pages of 4 KB): a small tmpfs, filled. A
    file can be made there (an inode), and a write past the free bytes fails with ENOSPC."""
    path.mkdir(parents=True, exist_ok=True)
    if not _mount(path, "size=256k"):
        pytest.skip("a full disk needs a tmpfs mount, which needs root")
    try:
        with (path / ".filler").open("wb", buffering=0) as handle:  # unbuffered: the write that fails raises here
            try:
                while True:
                    handle.write(b"\0" * 4096)
            except OSError:
                pass
            handle.truncate(max(0, handle.tell() - free))
        yield path
    finally:
        _unmount(path)

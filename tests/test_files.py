"""Atomic writes (lightbert.files): a file or directory is whole or absent, and no temporary file is left."""

from __future__ import annotations

import pytest

from lightbert.files import open_atomically, publish_directory, replace_atomically, write_atomically


def test_a_failed_write_keeps_the_old_file_and_leaves_nothing(tmp_path):
    path = write_atomically(tmp_path / "eval.json", "old\n")
    with pytest.raises(RuntimeError), open_atomically(path) as f:
        f.write("half of the new")
        raise RuntimeError("disk full")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.json"]


def test_replace_atomically_cleans_up_after_the_writer_fails(tmp_path):
    def write(tmp):
        tmp.write_bytes(b"half a checkpoint")
        raise OSError("killed")

    with pytest.raises(OSError, match="killed"):
        replace_atomically(tmp_path / "sub" / "last.ckpt", write)
    assert list((tmp_path / "sub").iterdir()) == []


def test_publish_directory_is_all_or_nothing(tmp_path):
    final = tmp_path / "cache"

    def fails(tmp):
        tmp.mkdir()
        (tmp / "part").write_text("x")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        publish_directory(final, fails)
    assert list(tmp_path.iterdir()) == []

    def writes(text):
        def write(tmp):
            tmp.mkdir()
            (tmp / "data").write_text(text)

        return write

    publish_directory(final, writes("first"))
    publish_directory(final, writes("second"))  # another process got there first: its copy stays
    assert (final / "data").read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["cache"]


def test_the_first_file_published_is_the_one_every_process_reads(tmp_path):
    from lightbert.files import publish_file_once

    path = tmp_path / "cache" / "tokenizer.json"
    publish_file_once(path, lambda tmp: tmp.write_text("first"))
    publish_file_once(path, lambda tmp: tmp.write_text("second"))  # a second run that trained its own
    assert path.read_text() == "first"
    assert sorted(p.name for p in path.parent.iterdir()) == ["tokenizer.json"]  # no temporary left


def test_a_rewritten_file_with_its_old_times_has_another_identity(tmp_path):
    import os

    from lightbert.data.local_files import file_identity

    path = tmp_path / "corpus.txt"
    path.write_text("the river city.\n")
    before, stat = file_identity(path), path.stat()
    path.write_text("the river team.\n")  # same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # cp -p, rsync -a
    assert file_identity(path) != before

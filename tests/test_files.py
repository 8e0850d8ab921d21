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

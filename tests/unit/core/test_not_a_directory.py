"""core.sources.not_a_directory: a checkpoint directory that is a special file, a dangling link or a loop is said in
one line, in core.paths.file_problem's words (a special file was "is not a directory (a special file), not a
directory: give its folder '/dev'")."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from lightprune.core.sources import check_checkpoint_name, not_a_directory

WHAT = "checkpoint directory"


def test_a_special_file_is_named_by_its_kind() -> None:
    error = not_a_directory("/dev/null", WHAT)
    assert type(error) is NotADirectoryError and error.errno == errno.ENOTDIR
    assert str(error) == ("checkpoint directory '/dev/null' is not a regular file (a character device) and not a "
                          "directory; give the directory")


def test_a_fifo_is_named_by_its_kind_and_never_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "ckpt")
    with pytest.raises(NotADirectoryError) as info:
        check_checkpoint_name(str(tmp_path / "ckpt"))  # the command's check of --model.init_args.checkpoint
    assert str(info.value) == (f"checkpoint directory {str(tmp_path / 'ckpt')!r} is not a regular file (a FIFO) and "
                               "not a directory; give the directory")


def test_links_and_files_keep_their_classes_and_say_what_to_do(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "file").write_text("x")
    expected = {
        "dangling": (FileNotFoundError, errno.ENOENT, (f"is a dangling symlink (its target "
                                                       f"{str(tmp_path / 'gone')!r} does not exist); restore it, or "
                                                       "give the directory")),
        "loop": (OSError, errno.ELOOP, (f"is a symlink loop (-> {str(tmp_path / 'loop')!r}); point it at the "
                                        "directory, or give the directory itself")),
        "file": (NotADirectoryError, errno.ENOTDIR, f"is a file, not a directory: give its folder {str(tmp_path)!r}"),
    }
    for name, (cls, code, said) in expected.items():
        error = not_a_directory(tmp_path / name, WHAT)
        assert (type(error), error.errno, str(error)) == (cls, code, f"{WHAT} {str(tmp_path / name)!r} {said}")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert str(not_a_directory("~/file", WHAT)) == f"{WHAT} {str(tmp_path / 'file')!r} {expected['file'][2]}"
    assert not_a_directory(tmp_path, WHAT) is None and not_a_directory(tmp_path / "none", WHAT) is None

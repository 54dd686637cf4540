"""check_plan_path (Export's and WidthExport's plan_path, and the command line's first pass) says what is at a
plan_path that is no file: a FIFO, a device, a dangling link or a loop was "does not exist"."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from lightprune.callbacks.export_dirs import check_plan_path

FIX = "name the plan file itself"


def test_a_special_file_is_named_by_its_kind(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "plan.json")
    for path, kind in (("/dev/null", "a character device"), (str(tmp_path / "plan.json"), "a FIFO")):
        with pytest.raises(OSError) as info:
            check_plan_path(path)
        assert type(info.value) is OSError and info.value.errno == errno.EINVAL
        assert str(info.value) == f"plan_path: {path!r} is not a regular file ({kind}): {FIX}"


def test_a_dangling_link_and_a_loop_are_said_as_such(tmp_path: Path) -> None:
    (tmp_path / "dangling.json").symlink_to(tmp_path / "gone.json")
    (tmp_path / "loop.json").symlink_to(tmp_path / "loop.json")
    with pytest.raises(FileNotFoundError) as info:
        check_plan_path(tmp_path / "dangling.json")
    assert str(info.value) == (f"plan_path: {str(tmp_path / 'dangling.json')!r} is a dangling symlink (its target "
                               f"{str(tmp_path / 'gone.json')!r} does not exist): {FIX}")
    with pytest.raises(OSError) as info:
        check_plan_path(tmp_path / "loop.json")
    assert type(info.value) is OSError and info.value.errno == errno.ELOOP
    assert str(info.value) == (f"plan_path: {str(tmp_path / 'loop.json')!r} is a symlink loop (-> "
                               f"{str(tmp_path / 'loop.json')!r}): {FIX}")


def test_a_file_a_link_to_one_and_a_missing_name_are_as_before(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "plan.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "plan.json")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert check_plan_path("~/plan.json") == str(tmp_path / "plan.json")
    assert check_plan_path(tmp_path / "link.json") == str(tmp_path / "link.json")
    with pytest.raises(FileNotFoundError) as info:
        check_plan_path("~/gone.json")
    assert str(info.value) == "plan_path: '~/gone.json' does not exist"

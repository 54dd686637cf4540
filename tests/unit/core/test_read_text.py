"""read_json / read_yaml (jsonio._read_text) say what is wrong with a file they cannot read: a special file (never
read: a FIFO would block), an empty file, a directory, a dangling link or a symlink loop, each naming the file."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

import lightprune as lp
from lightprune.core.errors import PlanError
from lightprune.core.jsonio import read_json, read_yaml


@pytest.fixture
def no_hang():
    """Fail instead of hanging when a test would block reading a FIFO."""
    def timeout(signum, frame):
        raise TimeoutError("the reader blocked on the FIFO")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_dev_null_is_not_a_regular_file() -> None:
    with pytest.raises(PlanError, match=r"^plan file '/dev/null' is not a regular file \(a character device\): name "
                                        r"the plan file itself$"):
        lp.ExpertPlan.load("/dev/null")


def test_a_fifo_is_refused_without_being_read(tmp_path: Path, no_hang) -> None:
    os.mkfifo(tmp_path / "plan.json")
    with pytest.raises(PlanError, match=r"plan\.json' is not a regular file \(a FIFO\)"):
        lp.ExpertPlan.load(tmp_path / "plan.json")
    with pytest.raises(ValueError, match=r"config file .* is not a regular file \(a FIFO\)"):
        read_yaml(tmp_path / "plan.json", "config")


@pytest.mark.parametrize("text, said", [("", r"0 bytes"), (" \n\t\n", "whitespace only")])
def test_an_empty_file_is_said_to_be_empty(tmp_path: Path, text, said) -> None:
    path = tmp_path / "plan.json"
    path.write_text(text)
    with pytest.raises(PlanError, match=rf"^plan file {str(path)!r} is empty \({said}\): there is nothing to read; "
                                        r"name the plan file meant, or write it again$"):
        lp.ExpertPlan.load(path)
    with pytest.raises(ValueError, match=r"is empty"):
        read_yaml(path, "config")


def test_a_dangling_link_and_a_loop_are_said_as_such(tmp_path: Path) -> None:
    (tmp_path / "dangling.json").symlink_to(tmp_path / "gone.json")
    (tmp_path / "loop.json").symlink_to(tmp_path / "loop.json")
    with pytest.raises(FileNotFoundError, match=r"dangling\.json' is a dangling symlink \(its target .*gone\.json' "
                                                r"does not exist\)"):
        read_json(tmp_path / "dangling.json", "export manifest")
    with pytest.raises(PlanError, match=r"loop\.json' is a symlink loop"):
        lp.ExpertPlan.load(tmp_path / "loop.json")


def test_a_directory_and_a_missing_file_keep_their_messages(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError, match=r"is a directory, not a file: name the plan file itself"):
        lp.ExpertPlan.load(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"plan file .*missing\.json' does not exist$"):
        lp.ExpertPlan.load(tmp_path / "missing.json")


"""core.paths: a name that is not a regular file is said as what it is (a directory, a dangling or looping link, a
special file), a state file is refused before a run reads or rewrites it (that, or a folder it cannot write), a file a
run must read is refused when missing or empty, and a save goes through a temporary file removed on any failure."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
import torch

from lightprune.core.paths import check_input_file, check_state_file, file_problem, folder_problem, write_atomically

FIX = "move it away"


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_file_problem_says_what_the_name_is(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "file").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    assert file_problem(tmp_path / "dir") == (IsADirectoryError, "is a directory, not a file")
    assert file_problem(tmp_path / "dangling") == (
        FileNotFoundError, f"is a dangling symlink (its target {str(tmp_path / 'nowhere')!r} does not exist)")
    assert file_problem(tmp_path / "loop") == (ValueError, f"is a symlink loop (-> {str(tmp_path / 'loop')!r})")
    assert file_problem(tmp_path / "fifo") == (ValueError, "is not a regular file (a FIFO)")
    assert file_problem("/dev/null") == (ValueError, "is not a regular file (a character device)")
    assert file_problem(tmp_path / "file") is None and file_problem(tmp_path / "link") is None
    assert file_problem(tmp_path / "missing") is None


@pytest.mark.parametrize("make, cls, why", [
    (lambda p: p.mkdir(), IsADirectoryError, "is a directory, not a file"),
    (lambda p: p.symlink_to(p.parent / "gone.pt"), FileNotFoundError, "is a dangling symlink"),
    (lambda p: os.mkfifo(p), ValueError, r"is not a regular file \(a FIFO\)"),
])
def test_a_state_path_that_is_not_a_regular_file_is_refused_naming_it(tmp_path: Path, make, cls, why) -> None:
    path = tmp_path / "state.pt"
    make(path)
    with pytest.raises(cls, match=rf"^calibration state {str(path)!r} {why}.*: the run reads and rewrites it "
                                  rf"there; {FIX}$"):
        check_state_file(path, "calibration state", FIX)


def test_a_state_whose_folder_cannot_be_written_is_refused(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "file").write_text("x")
    under_file = tmp_path / "file" / "run" / "state.pt"
    with pytest.raises(NotADirectoryError, match=rf"its folder {str(under_file.parent)!r} would be created under "
                                                 rf"{str(tmp_path / 'file')!r}, which is not a folder"):
        check_state_file(under_file, "calibration state", FIX)
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path)  # a read-only folder (root ignores
    with pytest.raises(PermissionError, match=r"cannot be written .*read-only for this user"):  # chmod: simulated)
        check_state_file(tmp_path / "new" / "state.pt", "calibration state", FIX)
    assert folder_problem(tmp_path / "file") is not None


def test_a_regular_or_missing_state_is_accepted(tmp_path: Path) -> None:
    check_state_file(tmp_path / "run" / "state.pt", "calibration state", FIX)  # nothing there yet
    (tmp_path / "state.pt").write_bytes(b"x")
    check_state_file(tmp_path / "state.pt", "calibration state", FIX)
    assert _names(tmp_path) == ["state.pt"]


@pytest.mark.parametrize("name, cls, why", [("missing.ckpt", FileNotFoundError, "does not exist"),
                                            ("empty.ckpt", ValueError, r"is empty \(0 bytes\)"),
                                            ("dir", IsADirectoryError, "is a directory")])
def test_an_input_file_that_cannot_be_read_is_refused(tmp_path: Path, name, cls, why) -> None:
    (tmp_path / "empty.ckpt").write_bytes(b"")
    (tmp_path / "dir").mkdir()
    with pytest.raises(cls, match=rf"^checkpoint {str(tmp_path / name)!r} {why}.*; {FIX}$"):
        check_input_file(tmp_path / name, "checkpoint", FIX)
    with pytest.raises(ValueError, match=r"'/dev/null' is not a regular file \(a character device\)"):
        check_input_file("/dev/null", "checkpoint", FIX)


def test_write_atomically_replaces_the_file(tmp_path: Path) -> None:
    path = write_atomically(tmp_path / "sub" / "state.pt", lambda tmp: torch.save({"a": 1}, tmp), "state")
    assert torch.load(path, weights_only=True) == {"a": 1} and _names(path.parent) == ["state.pt"]


def test_a_failed_save_removes_its_temporary_file_and_keeps_the_previous_state(tmp_path: Path) -> None:
    path = tmp_path / "state.pt"
    path.write_bytes(b"before")

    def full_disk(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as raised:
        write_atomically(path, full_disk, "calibration state")
    assert raised.value.errno == errno.ENOSPC
    assert str(raised.value) == (f"[Errno {errno.ENOSPC}] could not write calibration state {str(path)!r}: no space "
                                 "left on device; it is as it was")
    assert path.read_bytes() == b"before" and _names(tmp_path) == ["state.pt"]


def test_torch_save_s_own_error_names_the_file_and_its_cause(tmp_path: Path) -> None:
    def failing(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise RuntimeError("[enforce fail at inline_container.cc:1] . file write failed with strerror: No space "
                           "left on device\nmore lines")

    with pytest.raises(RuntimeError, match=rf"^could not write state {str(tmp_path / 'state.pt')!r}: no space left "
                                           r"on device; it is as it was$"):
        write_atomically(tmp_path / "state.pt", failing, "state")
    assert _names(tmp_path) == []


def test_a_directory_where_the_state_goes_is_named_and_nothing_is_left(tmp_path: Path) -> None:
    (tmp_path / "state.pt").mkdir()
    with pytest.raises(IsADirectoryError) as raised:
        write_atomically(tmp_path / "state.pt", lambda tmp: torch.save({}, tmp), "state")
    assert raised.value.errno == errno.EISDIR
    assert str(raised.value) == (f"[Errno {errno.EISDIR}] could not write state {str(tmp_path / 'state.pt')!r}: it is "
                                 "a directory, not a file: move it away, or write elsewhere; it is as it was")
    assert _names(tmp_path) == ["state.pt"] and (tmp_path / "state.pt").is_dir()


def _never(tmp: Path) -> None:
    raise AssertionError(f"{tmp} written before the target was checked")


def test_a_fifo_where_the_state_goes_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """The rename would replace the FIFO (or a device: ``/dev/full``) with a regular file: refused up front."""
    os.mkfifo(tmp_path / "state.pt")
    with pytest.raises(ValueError) as raised:
        write_atomically(tmp_path / "state.pt", _never, "state")
    assert str(raised.value) == (f"could not write state {str(tmp_path / 'state.pt')!r}: it is not a regular file (a "
                                 "FIFO): move it away, or write elsewhere; it is as it was")
    assert _names(tmp_path) == ["state.pt"] and stat.S_ISFIFO((tmp_path / "state.pt").lstat().st_mode)


def test_a_fifo_where_the_temporary_file_goes_is_refused_not_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "state.pt.tmp")
    with pytest.raises(ValueError) as raised:
        write_atomically(tmp_path / "state.pt", _never, "state")
    assert str(raised.value) == (f"could not write state {str(tmp_path / 'state.pt')!r}: its temporary file "
                                 f"{str(tmp_path / 'state.pt.tmp')!r} is not a regular file (a FIFO): move it away; "
                                 "it is as it was")
    assert _names(tmp_path) == ["state.pt.tmp"]


def test_an_interrupt_during_a_save_removes_the_temporary_file(tmp_path: Path) -> None:
    def interrupted(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomically(tmp_path / "state.pt", interrupted, "state")
    assert _names(tmp_path) == []


def test_a_full_disk_under_torch_save_is_named_through_a_python_file(tmp_path: Path) -> None:
    """torch.save given a path writes from C++ and loses the system's error ("iostream error"); given the open file
    (through_file) the error is Python's OSError, named with its cause, and nothing is left."""
    from lightprune.core.paths import through_file

    def full(handle):
        real = handle.write

        def write(data):
            raise OSError(28, "No space left on device")

        handle.write = write  # a full disk, for this file only
        try:
            torch.save({"a": torch.zeros(1000)}, handle)
        finally:
            handle.write = real

    with pytest.raises(OSError) as failed:
        write_atomically(tmp_path / "state.pt", through_file(full), "calibration state")
    assert str(failed.value) == (f"[Errno 28] could not write calibration state {str(tmp_path / 'state.pt')!r}: no "
                                 "space left on device; it is as it was")
    assert list(tmp_path.iterdir()) == []

"""write_json: a file that cannot be written is one error naming it, and the previous file stays as it was."""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

import pytest

from lightprune.core.jsonio import write_json


@pytest.mark.parametrize("code, cause", [(errno.ENOSPC, "no space left on device"),
                                         (errno.EROFS, "read-only file system"),
                                         (errno.EFBIG, "file too large")])
def test_a_write_that_fails_names_the_file_and_leaves_the_previous_one(tmp_path: Path, monkeypatch, code,
                                                                        cause) -> None:
    path = write_json({"keep": [1, 2]}, tmp_path / "plan.json")
    before = path.read_bytes()

    def failing(self, *args, **kwargs):
        self.with_name(self.name).open("w").write("{\"ke")  # half-written, as a full disk leaves it
        raise OSError(code, cause.capitalize(), str(self))

    monkeypatch.setattr(Path, "write_text", failing)
    with pytest.raises(OSError) as raised:
        write_json({"keep": [3]}, path)
    assert raised.value.errno == code
    assert str(raised.value) == f"[Errno {code}] could not write {str(path)!r}: {cause}; it is as it was"
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_a_file_where_the_folder_goes_is_named_as_the_cause(tmp_path: Path) -> None:
    """A parent that is a file said "file exists" (mkdir's error, about another name than the one written): the
    folder is named, and what is there."""
    (tmp_path / "f").write_text("x")
    target = tmp_path / "f" / "x.json"
    with pytest.raises(NotADirectoryError) as raised:
        write_json({}, target)
    assert raised.value.errno == errno.ENOTDIR
    assert str(raised.value) == (f"[Errno {errno.ENOTDIR}] could not write {str(target)!r}: its folder "
                                 f"{str(tmp_path / 'f')!r} is not a folder; it is as it was")
    deeper = tmp_path / "f" / "sub" / "x.json"
    with pytest.raises(NotADirectoryError) as raised:
        write_json({}, deeper)
    assert str(raised.value) == (f"[Errno {errno.ENOTDIR}] could not write {str(deeper)!r}: its folder "
                                 f"{str(tmp_path / 'f' / 'sub')!r} would be created under {str(tmp_path / 'f')!r}, "
                                 "which is not a folder; it is as it was")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"] and (tmp_path / "f").read_text() == "x"


def test_a_folder_left_where_the_temporary_file_goes_is_named_and_kept(tmp_path: Path) -> None:
    """A leftover ``x.json.tmp`` folder said "'x.json': is a directory": the temporary name is said, and the folder
    (someone's) stays with what it holds."""
    (tmp_path / "x.json.tmp").mkdir()
    (tmp_path / "x.json.tmp" / "kept").write_text("k")
    target = tmp_path / "x.json"
    with pytest.raises(IsADirectoryError) as raised:
        write_json({"a": 1}, target)
    assert str(raised.value) == (f"[Errno {errno.EISDIR}] could not write {str(target)!r}: its temporary file "
                                 f"{str(tmp_path / 'x.json.tmp')!r} is a directory, not a file: move it away; it is "
                                 "as it was")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json.tmp"]
    assert (tmp_path / "x.json.tmp" / "kept").read_text() == "k"


def test_a_folder_where_the_file_goes_is_said_and_the_temporary_file_removed(tmp_path: Path) -> None:
    (tmp_path / "x.json").mkdir()
    with pytest.raises(IsADirectoryError) as raised:
        write_json({"a": 1}, tmp_path / "x.json")
    assert str(raised.value) == (f"[Errno {errno.EISDIR}] could not write {str(tmp_path / 'x.json')!r}: it is a "
                                 "directory, not a file: move it away, or write elsewhere; it is as it was")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"] and not any((tmp_path / "x.json").iterdir())


def _bound(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))  # the name stays once the socket is closed


def _no_write(*args, **kwargs):
    raise AssertionError("nothing may be written before the target is checked")


@pytest.mark.parametrize("make, cls, why", [
    (os.mkfifo, ValueError, "is not a regular file (a FIFO)"),
    (lambda p: _bound(p), ValueError, "is not a regular file (a socket)"),
    (lambda p: p.symlink_to(p.parent / "nowhere"), FileNotFoundError,
     "is a dangling symlink (its target '{dir}/nowhere' does not exist)"),
])
def test_a_special_file_where_the_file_goes_is_refused_before_anything_is_written(tmp_path: Path, monkeypatch,
                                                                                  make, cls, why) -> None:
    """The rename of the temporary file would replace a FIFO, a socket or a device (``/dev/full``: a plan saved
    there returned normally and left a regular file in its place) with a regular file: refused up front, in
    :func:`~lightprune.core.paths.file_problem`'s words, the name left as it was."""
    target = tmp_path / "x.json"
    make(target)
    kind = target.lstat().st_mode
    monkeypatch.setattr(Path, "write_text", _no_write)
    with pytest.raises(cls) as raised:
        write_json({"a": 1}, target)
    code = f"[Errno {errno.ENOENT}] " if cls is FileNotFoundError else ""
    assert str(raised.value) == (f"{code}could not write {str(target)!r}: it {why.format(dir=tmp_path)}: move it "
                                 "away, or write elsewhere; it is as it was")
    assert target.lstat().st_mode == kind and sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_a_fifo_where_the_temporary_file_goes_is_refused_not_opened(tmp_path: Path) -> None:
    """Opening a FIFO to write it blocks until someone reads it: a leftover ``x.json.tmp`` FIFO is named, never
    opened, and kept."""
    os.mkfifo(tmp_path / "x.json.tmp")
    target = tmp_path / "x.json"
    with pytest.raises(ValueError) as raised:
        write_json({"a": 1}, target)
    assert str(raised.value) == (f"could not write {str(target)!r}: its temporary file "
                                 f"{str(tmp_path / 'x.json.tmp')!r} is not a regular file (a FIFO): move it away; it "
                                 "is as it was")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json.tmp"]


def test_a_plan_saved_onto_a_fifo_is_refused_and_a_link_to_a_file_is_written(tmp_path: Path) -> None:
    """Every plan's ``save`` writes through :func:`write_json`: ``ExpertPlan.save`` onto a FIFO is refused (it
    returned normally and replaced the name with a regular file), one onto a symlink to a regular file is written."""
    from lightprune.experts.plan import ExpertPlan

    plan = ExpertPlan(keep={0: [0, 1]}, num_experts={0: 4})
    os.mkfifo(tmp_path / "plan.json")
    with pytest.raises(ValueError, match=r"^could not write .*plan\.json': it is not a regular file \(a FIFO\)"):
        plan.save(tmp_path / "plan.json")
    assert stat.S_ISFIFO((tmp_path / "plan.json").lstat().st_mode)
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    plan.save(tmp_path / "link.json")
    assert ExpertPlan.load(tmp_path / "link.json").keep == {0: [0, 1]}

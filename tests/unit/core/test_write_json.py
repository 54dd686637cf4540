"""write_json: a file that cannot be written is one error naming it, and the previous file stays as it was."""

from __future__ import annotations

import errno
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
                                 "directory, not a file; it is as it was")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"] and not any((tmp_path / "x.json").iterdir())

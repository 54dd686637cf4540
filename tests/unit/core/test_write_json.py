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

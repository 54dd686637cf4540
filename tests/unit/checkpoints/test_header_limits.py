"""A safetensors header past the reader's bounds: longer than its cap (a ParseLimitError naming the file and the cap)
is told apart from a length the file cannot hold (corrupt or truncated), and one nested too deep is refused naming
the file before json recurses into it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightprune.checkpoints.header import HEADER_LIMIT, check_safetensors, header_bytes, read_header
from lightprune.core.parse_limits import ParseLimitError

READERS = (read_header, header_bytes, check_safetensors)


def _length_prefixed(path: Path, length: int, size: int, header: bytes = b"") -> Path:
    """A file of ``size`` bytes (sparse: nothing past ``header`` is written) whose length prefix says ``length``."""
    with open(path, "wb") as handle:
        handle.write(length.to_bytes(8, "little") + header)
        handle.truncate(size)
    return path


def test_a_header_over_the_cap_that_fits_in_the_file_names_the_cap(tmp_path: Path) -> None:
    length = HEADER_LIMIT + 1
    path = _length_prefixed(tmp_path / "model.safetensors", length, 8 + length + 16)
    for read in READERS:
        with pytest.raises(ParseLimitError) as info:
            read(path)
        assert str(info.value) == (f"safetensors file {str(path)!r}: header length {length} bytes exceeds the reader's "
                                   f"cap (limit {HEADER_LIMIT} bytes); the file is corrupt or not a safetensors file: "
                                   "restore it or save it again")


@pytest.mark.parametrize("length", [1000, HEADER_LIMIT + 8], ids=["under_the_cap", "over_the_cap"])
def test_a_header_length_the_file_cannot_hold_is_corrupt_or_truncated(tmp_path: Path, length: int) -> None:
    path = _length_prefixed(tmp_path / "model.safetensors", length, 500, b'{"__metadata__": {}}')
    for read in READERS:
        with pytest.raises(ValueError) as info:
            read(path)
        assert not isinstance(info.value, ParseLimitError)
        assert str(info.value) == (f"safetensors file {str(path)!r} is corrupt or truncated: header length {length} "
                                   "does not fit in the file of 500 bytes")


@pytest.mark.parametrize(("depth", "refused"), [(99, False), (100, True), (100_000, True)])
def test_a_header_nested_too_deep_is_refused_naming_the_file(tmp_path: Path, depth: int, refused: bool) -> None:
    """The header object holds ``depth`` arrays: 1 + ``depth`` levels."""
    text = ('{"__metadata__": {"format": "pt"}, "x": ' + "[" * depth + "]" * depth + "}").encode()
    path = _length_prefixed(tmp_path / "model.safetensors", len(text), 8 + len(text), text)
    if not refused:  # nested within the limit: read on, refused for what it is not (an entry of a tensor)
        with pytest.raises(ValueError, match="tensor 'x' has entry"):
            read_header(path)
        return
    with pytest.raises(ParseLimitError) as info:
        read_header(path)
    assert str(info.value) == (f"safetensors file {str(path)!r} (its header): JSON nested {depth + 1} levels deep "
                               "(limit 100); no file lightprune reads comes near that: check that it is the file meant")
    if depth == 100:  # the limit is the reader's own: json itself reads this one
        assert json.loads(text)["x"]

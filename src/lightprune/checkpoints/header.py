"""The safetensors format: its dtypes, and a file's header read and checked against the file's bytes.

A safetensors file is an 8-byte little-endian header length, a JSON header (each tensor's dtype, shape and byte
range in the data that follows, plus ``__metadata__``), then the tensors' bytes. Only headers are read here.

`read_header` reads the header JSON as the safetensors library transformers loads with does: UTF-8 text
without a byte-order mark, no ``NaN`` / ``Infinity``, no lone surrogate escape (each is refused, not read by one path
and refused by another). It accepts a header only when every byte of the data is described once: no key named twice,
every tensor a known dtype, a shape of non-negative integers and a range ``[begin, end)`` with
``end - begin == numel(shape) * itemsize(dtype)``; the ranges, in order, tile the data from 0 to the end of the
file without a gap or an overlap (what the safetensors format requires of a writer). Anything else is a
``ValueError`` naming the file, the tensor and the values: read as it is, such a file would hand out another
tensor's bytes, or a shape the bytes do not hold. A header longer than the reader's cap (`HEADER_LIMIT`) or
nested deeper than `MAX_DEPTH` is a
`ParseLimitError` naming the file and the limit, before it is read or parsed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from lightprune.core.jsonio import show, strict_int
from lightprune.core.parse_limits import ParseLimitError, check_json_depth

__all__ = ["HEADER_LIMIT", "SAFETENSORS_DTYPES", "header_bytes", "read_header", "check_safetensors", "dtype_size"]

#: safetensors dtype names -> torch dtypes
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
#: the longest header read, in bytes: a header describes each tensor in about 100 bytes, so a checkpoint of a million
#: tensors stays far below it; a longer one is a corrupt file, and would be read into memory whole
HEADER_LIMIT = 100 * 1024 * 1024


def dtype_size(name: str) -> int:
    """Bytes per element of a safetensors dtype name."""
    return torch.empty((), dtype=SAFETENSORS_DTYPES[name]).element_size()


def _raw_header(file: Path, size: int) -> bytes:
    """The first 8 + header-length bytes of a safetensors file (a bare ``ValueError`` when they cannot be; a
    `ParseLimitError` naming the file for a header over `HEADER_LIMIT`)."""
    with open(file, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise ValueError(f"{size} bytes, shorter than a safetensors header")
        length = int.from_bytes(head, "little")
        if length > size - 8:
            raise ValueError(f"header length {length} does not fit in the file of {size} bytes")
        if length > HEADER_LIMIT:
            raise ParseLimitError(f"safetensors file {str(file)!r}: header length {length} bytes exceeds the reader's "
                                  f"cap (limit {HEADER_LIMIT} bytes); the file is corrupt or not a safetensors file: "
                                  "restore it or save it again")
        return head + handle.read(length)


def header_bytes(file: str | os.PathLike) -> bytes:
    """The raw header (length prefix included) of a safetensors file; ``ValueError`` naming it when truncated."""
    file = Path(file)
    try:
        return _raw_header(file, file.stat().st_size)
    except ParseLimitError:
        raise
    except ValueError as err:
        raise ValueError(f"safetensors file {str(file)!r} is corrupt or truncated: {err}") from None


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A header object whose keys are unique and whose strings are text (a JSON object hook)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the header names {key!r} twice")
        for text in (key, value):
            if isinstance(text, str) and not _is_text(text):
                raise ValueError(f"the header holds the string {text!r} with a lone surrogate escape (\\udXXX), "
                                 "which is not text")
        out[key] = value
    return out


def _is_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _parse(raw: bytes) -> Any:
    """The header JSON as the safetensors library reads it (what transformers loads with): UTF-8 without a
    byte-order mark, no ``NaN`` / ``Infinity``, no lone surrogate escape, no ``-0`` (bare ``ValueError``)."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raise ValueError("its header starts with a UTF-8 byte-order mark, which the safetensors format does not "
                         "allow (transformers' loader refuses the file)")
    text = raw.decode("utf-8")  # strict: UTF-16 or stray bytes are refused, as safetensors refuses them

    def constant(name: str) -> Any:
        raise ValueError(f"the header holds {name}, which is not JSON")

    return json.loads(text, object_pairs_hook=_once, parse_constant=constant,
                      parse_int=lambda digits: -0.0 if digits == "-0" else int(digits))


def _entry(name: str, info: Any) -> tuple[int, int]:
    """The byte range of one header entry, after checking its dtype, shape and range agree (bare ``ValueError``)."""
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise ValueError(f"tensor {name!r} has entry {show(info)}; a tensor's entry holds exactly dtype, shape "
                         "and data_offsets")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if dtype not in SAFETENSORS_DTYPES:
        raise ValueError(f"tensor {name!r} has dtype {show(dtype)}, which lightprune does not read "
                         f"(known: {sorted(SAFETENSORS_DTYPES)})")
    sizes = [strict_int(s) for s in shape] if isinstance(shape, list) else [None]
    if any(s is None or s < 0 for s in sizes):
        raise ValueError(f"tensor {name!r} has shape {show(shape)}, not a list of non-negative integers")
    bounds = [strict_int(o) for o in offsets] if isinstance(offsets, list) and len(offsets) == 2 else [None]
    if any(b is None for b in bounds) or not 0 <= bounds[0] <= bounds[1]:
        raise ValueError(f"tensor {name!r} has data_offsets {show(offsets)}, not [begin, end] with 0 <= begin <= end")
    numel = 1
    for s in sizes:
        numel *= s
    if bounds[1] - bounds[0] != numel * dtype_size(dtype):
        raise ValueError(f"tensor {name!r}: {dtype} {sizes} is {numel * dtype_size(dtype)} bytes, its data_offsets "
                         f"{bounds} span {bounds[1] - bounds[0]}")
    return bounds[0], bounds[1]


def read_header(file: Path) -> dict[str, Any]:
    """The header of a safetensors file, checked against its bytes (see the module docstring; ``ValueError``
    naming the file)."""
    file = Path(file)
    size = file.stat().st_size
    try:
        raw = _raw_header(file, size)
        data = size - len(raw)
        check_json_depth(raw[8:], f"safetensors file {str(file)!r} (its header)")  # before json recurses
        header = _parse(raw[8:])
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
        metadata = header.get("__metadata__")
        if metadata is not None and (not isinstance(metadata, dict)
                                     or not all(isinstance(v, str) for v in metadata.values())):
            raise ValueError(f"__metadata__ is {show(metadata)}, not an object of strings")
        ranges = sorted((*_entry(name, info), name) for name, info in header.items() if name != "__metadata__")
        end, previous = 0, None
        for begin, stop, name in ranges:
            if begin != end:
                what = (f"overlaps {previous!r}" if begin < end else f"leaves bytes {end}..{begin} unaccounted for "
                        f"after {previous!r}" if previous else f"starts at byte {begin}, not 0")
                raise ValueError(f"tensor {name!r} (data_offsets [{begin}, {stop}]) {what}")
            end, previous = stop, name
        if end != data:
            raise ValueError(f"its tensors end at byte {end} of the data, the file holds {data} bytes of data")
    except ParseLimitError:
        raise
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"safetensors file {str(file)!r} is corrupt or truncated: {err}") from None
    return header


def check_safetensors(file: str | os.PathLike) -> None:
    """Raise ``ValueError`` naming ``file`` when its header is unreadable or disagrees with its bytes."""
    read_header(Path(file))

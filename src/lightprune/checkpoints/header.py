"""The safetensors format: its dtypes, and a file's header read and checked against the file's size.

A safetensors file is an 8-byte little-endian header length, a JSON header (each tensor's dtype, shape and byte
range in the data that follows, plus ``__metadata__``), then the tensors' bytes. Only headers are read here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["SAFETENSORS_DTYPES", "header_bytes", "read_header", "check_safetensors"]

#: safetensors dtype names -> torch dtypes
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
_HEADER_LIMIT = 100 * 1024 * 1024
def _raw_header(file: Path, size: int) -> bytes:
    """The first 8 + header-length bytes of a safetensors file (a bare ``ValueError`` when they cannot be)."""
    with open(file, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise ValueError(f"{size} bytes, shorter than a safetensors header")
        length = int.from_bytes(head, "little")
        if length > min(size - 8, _HEADER_LIMIT):
            raise ValueError(f"header length {length} does not fit in the file of {size} bytes")
        return head + handle.read(length)


def header_bytes(file: str | os.PathLike) -> bytes:
    """The raw header (length prefix included) of a safetensors file; ``ValueError`` naming it when truncated."""
    file = Path(file)
    try:
        return _raw_header(file, file.stat().st_size)
    except ValueError as err:
        raise ValueError(f"safetensors file {str(file)!r} is corrupt or truncated: {err}") from None


def read_header(file: Path) -> dict[str, Any]:
    """The header of a safetensors file, validated against the file's size (``ValueError`` naming it)."""
    size = file.stat().st_size
    try:
        raw = _raw_header(file, size)
        length = len(raw) - 8
        header = json.loads(raw[8:])
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
        end = 0
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, stop = info["data_offsets"]
            if not 0 <= begin <= stop:
                raise ValueError(f"tensor {name!r} has bad data offsets {info['data_offsets']}")
            end = max(end, int(stop))
    except ValueError as err:
        raise ValueError(f"safetensors file {str(file)!r} is corrupt or truncated: {err}") from None
    except (KeyError, TypeError, UnicodeDecodeError) as err:
        raise ValueError(f"safetensors file {str(file)!r} has a corrupt header: {err!r}") from None
    if 8 + length + end != size:
        raise ValueError(f"safetensors file {str(file)!r} is corrupt or truncated: its header describes "
                         f"{8 + length + end} bytes, the file has {size}")
    return header


def check_safetensors(file: str | os.PathLike) -> None:
    """Raise ``ValueError`` naming ``file`` when its header is unreadable or its size disagrees with it."""
    read_header(Path(file))

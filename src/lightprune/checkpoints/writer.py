"""A safetensors file written tensor by tensor: :class:`SafetensorsWriter`.

The safetensors format is an 8-byte little-endian header length, a JSON header (each tensor's dtype, shape and
byte range in the data that follows, plus ``__metadata__``), then the tensors' bytes. Everything the header
holds is known before any data is read (names, dtypes and shapes come from the source headers and the plan), so
the header is written first and each tensor's bytes follow as they are produced, in pieces if need be (an expert
at a time): memory holds one piece, never the shard. Each tensor is checked against its header entry; a file
left incomplete is an error at :meth:`SafetensorsWriter.close`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from lightprune.checkpoints.header import SAFETENSORS_DTYPES

__all__ = ["SafetensorsWriter", "TensorEntry"]

_NAMES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}
TensorEntry = tuple[str, torch.dtype, tuple[int, ...]]
"""``(name, dtype, shape)`` of one tensor of the file, in the order its data is written."""


def _nbytes(dtype: torch.dtype, shape: Sequence[int]) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count * torch.empty((), dtype=dtype).element_size()


class SafetensorsWriter:
    """``writer = SafetensorsWriter(path, entries, metadata)``; then for each entry in order,
    ``writer.write(name, tensor)`` or several ``writer.write(name, piece)`` whose rows (dimension 0) make the
    tensor; ``writer.close()`` checks that every byte was written. A context manager closes it (and, when the
    block raised, leaves the partial file to the caller's cleanup)."""

    def __init__(self, path: str | os.PathLike, entries: Sequence[TensorEntry],
                 metadata: dict[str, str] | None = None):
        self.path = Path(path)
        self._entries = list(entries)
        header: dict[str, object] = {"__metadata__": {"format": "pt", **(metadata or {})}}
        offset = 0
        self._sizes = []
        for name, dtype, shape in self._entries:
            if dtype not in _NAMES:
                raise ValueError(f"{self.path.name}: tensor {name!r} has dtype {dtype}, not a safetensors dtype")
            size = _nbytes(dtype, shape)
            header[name] = {"dtype": _NAMES[dtype], "shape": [int(s) for s in shape],
                            "data_offsets": [offset, offset + size]}
            self._sizes.append(size)
            offset += size
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
        self._handle = open(self.path, "wb")
        self._handle.write(len(raw).to_bytes(8, "little") + raw)
        self._current = 0        # entry being written
        self._written = 0        # its bytes so far

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """The next bytes of tensor ``name``: the whole tensor, or its next rows."""
        if self._current >= len(self._entries):
            raise ValueError(f"{self.path.name}: {name!r} written after the last tensor of the header")
        expected, dtype, shape = self._entries[self._current]
        if name != expected:
            raise ValueError(f"{self.path.name}: got tensor {name!r}, the header's next is {expected!r}")
        if tensor.dtype != dtype or tensor.dim() != len(shape) or tuple(tensor.shape[1:]) != tuple(shape[1:]):
            raise ValueError(f"{self.path.name}: tensor {name!r} is {tensor.dtype} {list(tensor.shape)}, the header "
                             f"says {dtype} {list(shape)}")
        data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        if self._written + data.nbytes > self._sizes[self._current]:
            raise ValueError(f"{self.path.name}: tensor {name!r} got more bytes than its shape {list(shape)} holds")
        self._handle.write(memoryview(data))
        self._written += data.nbytes
        if self._written == self._sizes[self._current]:
            self._current, self._written = self._current + 1, 0

    def close(self) -> None:
        if self._handle.closed:
            return
        self._handle.close()
        if self._current < len(self._entries):
            name = self._entries[self._current][0]
            raise ValueError(f"{self.path.name}: closed before tensor {name!r} was complete "
                             f"({self._written} of {self._sizes[self._current]} bytes)")

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._handle.close()

"""A safetensors file written tensor by tensor: `SafetensorsWriter`.

The safetensors format is an 8-byte little-endian header length, a JSON header (each tensor's dtype, shape and
byte range in the data that follows, plus ``__metadata__``), then the tensors' bytes. Everything the header
holds is known before any data is read (names, dtypes and shapes come from the source headers and the plan), so
the header is written first and each tensor's bytes follow as they are produced, in pieces if need be (an expert
at a time): memory holds one piece, never the shard. Each tensor is checked against its header entry; a file
left incomplete is an error at `SafetensorsWriter.close`. Bytes another file holds as they are to be written
(a tensor copied unchanged) go from file to file in the kernel (`SafetensorsWriter.copy`, ``copy_file_range``),
not through this process's memory.
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


#: whether this system offers a kernel copy between files
_KERNEL_COPY = hasattr(os, "copy_file_range")
#: bytes a copy without the kernel's moves at a time
_COPY_PIECE = 64 << 20


def _write_all(fd: int, data: memoryview) -> None:
    done = 0
    while done < len(data):
        done += os.write(fd, data[done:])


def _copy_through_buffer(source: int, out: int, offset: int, nbytes: int) -> int:
    """Copy up to `_COPY_PIECE` of the ``nbytes`` bytes at ``offset`` of ``source`` to ``out``; returns the
    count copied."""
    data = os.pread(source, min(nbytes, _COPY_PIECE), offset)
    if not data:
        raise ValueError(f"the source file ended at byte {offset}, {nbytes} bytes short of the copy")
    _write_all(out, memoryview(data))
    return len(data)


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
        self._handle = open(self.path, "wb", buffering=0)  # unbuffered: writes and kernel copies interleave
        _write_all(self._handle.fileno(), memoryview(len(raw).to_bytes(8, "little") + raw))
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
        self._check_room(name, shape, data.nbytes)
        _write_all(self._handle.fileno(), memoryview(data))
        self._wrote(data.nbytes)

    def copy(self, name: str, fd: int, offset: int, nbytes: int) -> None:
        """The next ``nbytes`` bytes of tensor ``name`` copied from open file ``fd`` at ``offset`` by the kernel
        (``os.copy_file_range``; through a buffer where the system or the file systems do not offer it). The caller
        vouches that they are the tensor's next whole rows, of its dtype."""
        if self._current >= len(self._entries) or name != self._entries[self._current][0]:
            following = self._entries[self._current][0] if self._current < len(self._entries) else None
            raise ValueError(f"{self.path.name}: got tensor {name!r}, the header's next is {following!r}")
        self._check_room(name, self._entries[self._current][2], nbytes)
        out, done = self._handle.fileno(), 0
        while done < nbytes:
            try:
                got = os.copy_file_range(fd, out, nbytes - done, offset + done) if _KERNEL_COPY else 0
            except OSError:  # EXDEV, ENOSYS, EINVAL, ...: no kernel copy between these two files
                got = 0
            if got == 0:
                got = _copy_through_buffer(fd, out, offset + done, nbytes - done)
            done += got
        self._wrote(nbytes)

    def _check_room(self, name: str, shape: Sequence[int], nbytes: int) -> None:
        if self._written + nbytes > self._sizes[self._current]:
            raise ValueError(f"{self.path.name}: tensor {name!r} got more bytes than its shape {list(shape)} holds")

    def _wrote(self, nbytes: int) -> None:
        self._written += nbytes
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

"""A safetensors checkpoint directory read one tensor at a time: :class:`Checkpoint`.

Only the headers are read when it opens (validated against the file sizes, as :func:`load_pruned` does): the
tensor names, dtypes, shapes and byte ranges of every shard. A tensor's data is read when asked for
(:meth:`Checkpoint.tensor`, :meth:`Checkpoint.rows`, :meth:`Checkpoint.read_into` straight into a caller's tensor)
with positioned reads, not a memory map: what stays in this process's memory is what the caller keeps (pages of
a mapped file would count in its resident set until unmapped).

Refused when opened, with the path in the message: no directory, no config.json, no ``.safetensors`` weights
(pickle files are never read), a shard index naming a missing file, a truncated or corrupt shard, a
``quantization_config`` (lightprune streams float checkpoints).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from lightprune.checkpoints.directory import SAFE_INDEX, check_checkpoint, weight_files
from lightprune.checkpoints.header import SAFETENSORS_DTYPES, read_header

__all__ = ["Checkpoint"]


def _data_start(file: Path) -> int:
    """Where a safetensors file's tensor data starts: 8 + its header's length (the header itself was read and
    checked against the file's size by :func:`read_header`)."""
    with open(file, "rb") as handle:
        return 8 + int.from_bytes(handle.read(8), "little")


class Checkpoint:
    """A checkpoint directory: ``config`` (transformers' config object), ``keys()`` the tensor names on disk,
    their ``shape`` / ``dtype`` / ``file`` from the headers, :meth:`tensor` / :meth:`rows` / :meth:`read_into` to
    read one. Use it as a context manager (or call :meth:`close`) to close the open shards."""

    def __init__(self, path: str | os.PathLike):
        self.path = check_checkpoint(path)
        from transformers import AutoConfig

        raw = json.loads((self.path / "config.json").read_text())
        if raw.get("quantization_config") is not None:
            raise ValueError(f"checkpoint {str(self.path)!r} is quantized (config.json has a quantization_config): "
                             "lightprune streams float checkpoints")
        self.config = AutoConfig.from_pretrained(self.path)
        self.files = weight_files(self.path)
        self._entries: dict[str, tuple[Path, dict[str, Any]]] = {}
        self.metadata: dict[str, dict[str, str]] = {}
        for file in self.files:
            header = read_header(file)
            self.metadata[file.name] = header.pop("__metadata__", None) or {}
            for name, info in header.items():
                if name in self._entries:
                    raise ValueError(f"checkpoint {str(self.path)!r}: tensor {name!r} is stored twice "
                                     f"({self._entries[name][0].name} and {file.name})")
                self._entries[name] = (file, info)
        self.sharded = (self.path / SAFE_INDEX).is_file()
        self._data_start = {file: _data_start(file) for file in self.files}
        self._fds: dict[Path, int] = {}

    # ------------------------------------------------------------------ headers
    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def file(self, key: str) -> Path:
        return self._entry(key)[0]

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._entry(key)[1]["shape"])

    def dtype(self, key: str) -> torch.dtype:
        name = self._entry(key)[1]["dtype"]
        if name not in SAFETENSORS_DTYPES:
            raise ValueError(f"checkpoint {str(self.path)!r}: tensor {key!r} has dtype {name}, which lightprune "
                             f"does not read (known: {sorted(SAFETENSORS_DTYPES)})")
        return SAFETENSORS_DTYPES[name]

    def nbytes(self, key: str) -> int:
        begin, end = self._entry(key)[1]["data_offsets"]
        return int(end) - int(begin)

    @property
    def total_bytes(self) -> int:
        """Bytes of tensor data (headers excluded)."""
        return sum(self.nbytes(key) for key in self._entries)

    def keys_in(self, file: Path) -> list[str]:
        """The tensors of one shard, in the order of their data in the file."""
        return sorted((k for k, (f, _) in self._entries.items() if f == file),
                      key=lambda k: self._entries[k][1]["data_offsets"][0])

    # ------------------------------------------------------------------ data
    def tensor(self, key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tensor ``key``, read now into memory the caller owns (cast to ``dtype`` when given)."""
        shape = self.shape(key)
        out = torch.empty(shape, dtype=self.dtype(key))
        self.read_into(key, out)
        return out if dtype is None or dtype == out.dtype else out.to(dtype)

    def rows(self, key: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` (dimension 0) of ``key``: only their bytes are read."""
        shape = self.shape(key)
        out = torch.empty((stop - start, *shape[1:]), dtype=self.dtype(key))
        self.read_into(key, out, start)
        return out

    def read_into(self, key: str, out: torch.Tensor, start: int = 0) -> None:
        """Read ``out.numel()`` elements of ``key`` from row ``start`` (dimension 0) into ``out`` (contiguous, the
        tensor's dtype): positioned reads of the file, no memory map, so nothing of the file stays mapped in this
        process after the call."""
        file, info = self._entry(key)
        if out.dtype != self.dtype(key) or not out.is_contiguous():
            raise ValueError(f"read_into {key!r}: needs a contiguous {self.dtype(key)} tensor, got {out.dtype}")
        shape = self.shape(key)
        row = self.nbytes(key) // shape[0] if shape and shape[0] else 0
        begin = self._data_start[file] + int(info["data_offsets"][0]) + start * row
        view = memoryview(out.reshape(-1).view(torch.uint8).numpy()) if out.numel() else memoryview(b"")
        if begin + len(view) > self._data_start[file] + int(info["data_offsets"][1]):
            raise ValueError(f"read_into {key!r}: rows from {start} for {list(out.shape)} run past the tensor "
                             f"{list(shape)}")
        fd, done = self._fd(file), 0
        while done < len(view):
            got = os.preadv(fd, [view[done:]], begin + done)
            if got <= 0:
                raise ValueError(f"checkpoint {str(self.path)!r}: {file.name} ended while reading {key!r}")
            done += got

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ------------------------------------------------------------------ internals
    def _entry(self, key: str) -> tuple[Path, dict[str, Any]]:
        try:
            return self._entries[key]
        except KeyError:
            raise KeyError(f"checkpoint {str(self.path)!r} has no tensor {key!r}") from None

    def _fd(self, file: Path) -> int:
        if file not in self._fds:
            self._fds[file] = os.open(file, os.O_RDONLY)
        return self._fds[file]

    def __repr__(self) -> str:
        return (f"Checkpoint({str(self.path)!r}, {self.config.model_type}, {len(self._entries)} tensors in "
                f"{len(self.files)} file(s), {self.total_bytes} bytes)")

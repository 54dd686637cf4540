"""A safetensors checkpoint directory read one tensor at a time: [`Checkpoint`][].

Only the headers are read when it opens (validated against the file sizes, as
[`load_pruned`][lightprune.export.load.load_pruned] does): the
tensor names, dtypes, shapes and byte ranges of every shard. A tensor's data is read when asked for
([`Checkpoint.tensor`][], [`Checkpoint.rows`][], [`Checkpoint.read_into`][] straight into a caller's tensor)
with positioned reads, not a memory map: what stays in this process's memory is what the caller keeps (pages of
a mapped file would count in its resident set until unmapped).

Opening it is where every path that reads a checkpoint (streamed scores, pruning, calibration and fine-tuning,
and [`load_pruned`][lightprune.export.load.load_pruned] before transformers loads anything) has its files checked,
alike: the directory, config.json and the weight files (what [`check_checkpoint`][..directory.check_checkpoint]
checks: which files are the weights, the shard index against the shards, every header against its bytes, each read
once), the files an export copies along (tokenizer, processor, chat templates, generation config: none a
directory, a broken symlink or a special file, `copied_files`), then,
before any model is built:

- config.json's values (`check_config_values`: no NaN or infinite number, no
  activation transformers does not know, no ``transformers_weights`` naming other weights);
- a ``quantization_config`` only of a format lightprune reads, checked against the headers
  (`stored_quantization`: every quantized weight with its scales, in the
  block grid and dtypes of the format); such a checkpoint reads as its *logical* tensors ([`Checkpoint.keys`][],
  [`Checkpoint.tensor`][], ...: each quantized weight a float tensor in the model's dtype, dequantized as it is
  read, its scales hidden), and as it is *stored* ([`Checkpoint.stored_keys_in`][], [`Checkpoint.parts`][],
  [`Checkpoint.stored_tensor`][], ...: what a pruned checkpoint copies byte for byte);
- the config's layer counts and ``dtype`` against the weights
  (`config_against_weights`).

What the model needs of the tensors is checked by the [`Skeleton`][..skeleton.Skeleton] built on
it (`lightprune.checkpoints.contents`).
"""

from __future__ import annotations

import math
import mmap
import os
import warnings
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from lightprune.checkpoints.config_against_weights import check_config_dtype, check_layer_counts, model_dtype
from lightprune.checkpoints.directory import (
    SAFE_INDEX,
    checkpoint_directory,
    copied_files,
    disk_entries,
    read_config,
    readable_inputs,
    warn_pickle_weights,
    weight_files,
)
from lightprune.checkpoints.header import SAFETENSORS_DTYPES
from lightprune.checkpoints.quantized import stored_quantization
from lightprune.checkpoints.quantized_tensor import StoredFormat
from lightprune.checkpoints.strict import check_config_values

__all__ = ["Checkpoint"]

_readahead_said = False


def _readahead_off(exc: BaseException) -> None:
    """Say once per process that a checkpoint reads without readahead (its thread could not be started)."""
    global _readahead_said
    if not _readahead_said:
        _readahead_said = True
        warnings.warn(f"lightprune: the checkpoint readahead thread could not be started ({exc}); reading without "
                      "readahead (the same results, slower on a cold disk)", RuntimeWarning, stacklevel=3)


def _advise(spans: list[tuple[int, int, int]]) -> None:
    """``posix_fadvise(fd, offset, length, WILLNEED)`` for each span; errors ignored (advice only: a closed file or
    a file system without it reads as before)."""
    for fd, offset, length in spans:
        try:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass


def _data_start(file: Path) -> int:
    """Where a safetensors file's tensor data starts: 8 + its header's length (the header itself was read and
    checked against the file's size by `read_header`)."""
    with open(file, "rb") as handle:
        return 8 + int.from_bytes(handle.read(8), "little")


class Checkpoint:
    """A checkpoint directory: ``config`` (transformers' config object), ``keys()`` the tensor names on disk,
    their ``shape`` / ``dtype`` / ``file`` from the headers, [`tensor`][] / [`rows`][] / [`read_into`][] to
    read one. Use it as a context manager (or call `close`) to close the open shards."""

    def __init__(self, path: str | os.PathLike):
        self.path = checkpoint_directory(path)
        self._fds: dict[Path, int] = {}
        # will_need's background thread, made on first use (False: it could not be started, no readahead)
        self._advice: ThreadPoolExecutor | None | bool = None
        with readable_inputs():  # a file it cannot read: one line naming it
            self._open()

    def _open(self) -> None:
        from transformers import AutoConfig

        self.raw_config = read_config(self.path)
        check_config_values(self.path, self.raw_config)
        self.files = weight_files(self.path)
        warn_pickle_weights(self.path)
        #: {file name: the header's ``__metadata__``}
        self.metadata: dict[str, dict[str, str]] = {}
        self._entries: dict[str, tuple[Path, dict[str, Any]]] = disk_entries(self.path, self.metadata)
        copied_files(self.path)  # what an export copies along: no directory or broken link in its place
        #: the stored format (None: float)
        self.quantization: StoredFormat | None = stored_quantization(
            self.path, self.raw_config, self._entries, model_dtype(self.raw_config, self._entries))
        self._quantized = self.quantization.tensors if self.quantization is not None else {}
        #: {stored key that holds a quantized tensor's values: the logical key}; the stored keys of its other parts
        self._logical_of = {found.parts[0]: key for key, found in self._quantized.items()}
        self._companions = {part for found in self._quantized.values() for part in found.parts[1:]}
        check_layer_counts(self.path, self.raw_config, self._entries)
        self.config = AutoConfig.from_pretrained(self.path)
        check_config_dtype(self)
        self.sharded = (self.path / SAFE_INDEX).is_file()
        self._data_start = {file: _data_start(file) for file in self.files}

    # ------------------------------------------------------------------ headers (logical)
    def _logical(self, stored: list[str]) -> list[str]:
        """The logical keys of ``stored`` keys, in their order: a quantized tensor's at its values' place, its
        other parts left out."""
        return [self._logical_of.get(key, key) for key in stored if key not in self._companions]

    def keys(self) -> list[str]:
        """The logical tensor names: the stored ones, a quantized tensor's parts as its one name."""
        return self._logical(list(self._entries))

    def entries(self) -> dict[str, tuple[Path, dict[str, Any]]]:
        """{logical tensor: (its file, its stored header entry: a quantized tensor's values')}."""
        return {key: self._entries[self.parts(key)[0]] for key in self.keys()}

    def __contains__(self, key: str) -> bool:
        return key in self._quantized or (key in self._entries and key not in self._companions
                                          and key not in self._logical_of)

    def file(self, key: str) -> Path:
        return self._entry(self.parts(key)[0])[0]

    def shape(self, key: str) -> tuple[int, ...]:
        return self._quantized[key].shape if key in self._quantized else self.stored_shape(key)

    def dtype(self, key: str) -> torch.dtype:
        return self._quantized[key].dtype if key in self._quantized else self.stored_dtype(key)

    def dtype_name(self, key: str) -> str:
        """The dtype as a safetensors header names it (``F32``, ``BF16``, ``I8``, ...; a quantized tensor's: its
        dequantized one)."""
        if key in self._quantized:
            return next(name for name, dtype in SAFETENSORS_DTYPES.items() if dtype == self._quantized[key].dtype)
        return self._entry(key)[1]["dtype"]

    def nbytes(self, key: str) -> int:
        """Bytes of the logical tensor (a quantized one's dequantized size)."""
        if key in self._quantized:
            found = self._quantized[key]
            return math.prod(found.shape) * found.dtype.itemsize
        return self.stored_nbytes(key)

    @property
    def total_bytes(self) -> int:
        """Bytes of tensor data as stored (headers excluded)."""
        return sum(self.stored_nbytes(key) for key in self._entries)

    def keys_in(self, file: Path) -> list[str]:
        """The logical tensors of one shard, in the order of their data in the file."""
        return self._logical(self.stored_keys_in(file))

    # ------------------------------------------------------------------ headers (stored)
    def parts(self, key: str) -> tuple[str, ...]:
        """The stored keys of logical tensor ``key``: itself, and a quantized one's scales after it."""
        return self._quantized[key].parts if key in self._quantized else (key,)

    def stored_shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._entry(key)[1]["shape"])

    def stored_dtype(self, key: str) -> torch.dtype:
        return SAFETENSORS_DTYPES[self._entry(key)[1]["dtype"]]

    def stored_nbytes(self, key: str) -> int:
        begin, end = self._entry(key)[1]["data_offsets"]
        return int(end) - int(begin)

    def stored_keys_in(self, file: Path) -> list[str]:
        """The stored tensors of one shard (scales included), in the order of their data in the file."""
        return sorted((k for k, (f, _) in self._entries.items() if f == file),
                      key=lambda k: self._entries[k][1]["data_offsets"][0])

    # ------------------------------------------------------------------ data
    def tensor(self, key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The logical tensor ``key``, read now into memory the caller owns (cast to ``dtype`` when given; a quantized
        one dequantized straight into ``dtype``)."""
        if key in self._quantized:
            parts = {name: self.stored_tensor(name) for name in self._quantized[key].parts}
            return self.quantization.dequantize(parts, key, dtype)
        out = self.stored_tensor(key)
        return out if dtype is None or dtype == out.dtype else out.to(dtype)

    def rows(self, key: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` (dimension 0) of logical tensor ``key``: only their bytes are read (a quantized
        tensor of more than 2 dimensions: those rows of its values and scales; of 2: the whole, sliced)."""
        if key in self._quantized:
            return self._dequantized_rows(key, start, stop)
        return self.stored_rows(key, start, stop)

    def _dequantized_rows(self, key: str, start: int, stop: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``start:stop`` of quantized tensor ``key``, dequantized (into ``out`` when given)."""
        found = self._quantized[key]
        if len(found.shape) > 2:
            parts = {name: self.stored_rows(name, start, stop) for name in found.parts}
        else:
            parts = {name: self.stored_tensor(name) for name in found.parts}
        value = self.quantization.dequantize(parts, key, out.dtype if out is not None else None)
        if len(found.shape) <= 2 and (start, stop) != (0, found.shape[0]):
            value = value[start:stop]
        if out is None:
            return value if value.is_contiguous() else value.contiguous()
        out.copy_(value.reshape(out.shape))
        return out

    def read_into(self, key: str, out: torch.Tensor, start: int = 0) -> None:
        """Read ``out.numel()`` elements of logical tensor ``key`` from row ``start`` (dimension 0) into ``out``
        (contiguous, the tensor's dtype); see [`read_stored_into`][]."""
        if key not in self._quantized:
            self.read_stored_into(key, out, start)
            return
        if out.dtype != self.dtype(key) or not out.is_contiguous():
            raise ValueError(f"read_into {key!r}: needs a contiguous {self.dtype(key)} tensor, got {out.dtype}")
        rows = out.shape[0] if out.dim() == len(self.shape(key)) else 1
        self._dequantized_rows(key, start, start + rows, out)

    def stored_tensor(self, key: str) -> torch.Tensor:
        """The stored tensor ``key`` (a quantized tensor's values or scales as stored), read now."""
        out = torch.empty(self.stored_shape(key), dtype=self.stored_dtype(key))
        self.read_stored_into(key, out)
        return out

    def stored_rows(self, key: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` (dimension 0) of stored tensor ``key``: only their bytes are read."""
        shape = self.stored_shape(key)
        out = torch.empty((stop - start, *shape[1:]), dtype=self.stored_dtype(key))
        self.read_stored_into(key, out, start)
        return out

    def read_stored_into(self, key: str, out: torch.Tensor, start: int = 0) -> None:
        """Read ``out.numel()`` elements of stored tensor ``key`` from row ``start`` (dimension 0) into ``out``
        (contiguous, the stored dtype): positioned reads of the file, no memory map, so nothing of the file stays
        mapped in this process after the call."""
        file, info = self._entry(key)
        if out.dtype != self.stored_dtype(key) or not out.is_contiguous():
            raise ValueError(f"read_into {key!r}: needs a contiguous {self.stored_dtype(key)} tensor, got {out.dtype}")
        shape = self.stored_shape(key)
        row = self.stored_nbytes(key) // shape[0] if shape and shape[0] else 0
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

    def stored_span(self, key: str, start: int = 0, stop: int | None = None) -> tuple[int, int, int]:
        """(an open descriptor of its file, byte offset, byte count) of rows ``start:stop`` (dimension 0; ``stop``
        None: to the end) of stored tensor ``key``: what a copy of those bytes reads."""
        file, info = self._entry(key)
        shape = self.stored_shape(key)
        row = self.stored_nbytes(key) // shape[0] if shape and shape[0] else 0
        stop = (shape[0] if shape else 1) if stop is None else stop
        if not 0 <= start <= stop <= (shape[0] if shape else 1):
            raise ValueError(f"stored_span {key!r}: rows {start}:{stop} of {list(shape)}")
        nbytes = (stop - start) * row if shape else self.stored_nbytes(key)
        return self._fd(file), self._data_start[file] + int(info["data_offsets"][0]) + start * row, nbytes

    def mapped_rows(self, key: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows ``start:stop`` of stored tensor ``key`` as a read-only tensor over the file's pages (nothing copied):
        for reading the bytes once, as a check does. The pages are mapped until the tensor and its views are dropped
        (they count in this process's resident set until then): keep it no longer than the read."""
        fd, offset, nbytes = self.stored_span(key, start, stop)
        shape = self.stored_shape(key)
        rows = (stop if stop is not None else (shape[0] if shape else 1)) - start
        dims = (rows, *shape[1:]) if shape else ()
        if nbytes == 0:
            return torch.empty(dims, dtype=self.stored_dtype(key))
        base = offset - offset % mmap.ALLOCATIONGRANULARITY
        window = mmap.mmap(fd, offset - base + nbytes, offset=base, access=mmap.ACCESS_READ)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch: "the given buffer is not writable" (it is not)
            flat = torch.frombuffer(window, dtype=torch.uint8, count=nbytes, offset=offset - base)
        return flat.view(self.stored_dtype(key)).view(dims)

    def will_need(self, keys: list[str]) -> None:
        """Tell the kernel that the bytes of ``keys`` are read next (``posix_fadvise(WILLNEED)`` per file over the
        span of their data, adjacent tensors merged): it reads them into the page cache in the background, so that a
        later [`read_into`][] copies from memory instead of waiting on the disk. Issued from a background thread
        (a large advice can block while the reads are queued); a no-op where the call does not exist, and from
        the first time that thread cannot be started (a thread or memory limit: said once per process)."""
        if not keys or not hasattr(os, "posix_fadvise"):
            return
        spans: dict[Path, list[list[int]]] = defaultdict(list)
        keys = [part for key in keys for part in self.parts(key)]
        for key in sorted(keys, key=lambda k: (str(self.file(k)), self._entry(k)[1]["data_offsets"][0])):
            file, info = self._entry(key)
            begin, end = (self._data_start[file] + int(offset) for offset in info["data_offsets"])
            found = spans[file]
            if found and begin <= found[-1][1]:
                found[-1][1] = max(found[-1][1], end)
            else:
                found.append([begin, end])
        work = [(self._fd(file), begin, end - begin) for file, found in spans.items() for begin, end in found]
        if self._advice is False:  # its thread could not start: read without the advice
            return
        if self._advice is None:
            self._advice = ThreadPoolExecutor(1, thread_name_prefix="lightprune-readahead")
        try:
            self._advice.submit(_advise, work)
        except RuntimeError as exc:  # no thread to spare (a memory or thread limit): reads go on, only slower
            self._advice.shutdown(wait=False, cancel_futures=True)
            self._advice = False
            _readahead_off(exc)

    def close(self) -> None:
        if self._advice:
            self._advice.shutdown(wait=True)
        self._advice = None
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

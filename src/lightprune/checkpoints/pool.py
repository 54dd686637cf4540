"""Memory that skeletons released, read into again by their next load ([`ReadPool`][]) or given back to the
system ([`trim_freed_memory`][]).

Streamed paths load layers of the same shapes in turn (a score reads layer after layer; verification reads a source
layer, then the pruned one, then the next source layer). Reading into memory whose pages are already mapped is
about twice as fast as reading into new memory (a positioned read into fresh memory is bound by its page faults,
~1.5 GB/s measured), and keeping the memory avoids returning it to the system and asking for it again. A pool is
shared by the skeletons that load in turn, so that one's released layer is the memory the other reads into (the
pruned layer's smaller tensors are carved from the source layer's storages): the memory held is that of the
largest layer, not the sum of each skeleton's.

A released tensor goes to the pool only when nothing else holds its storage (another tensor or view of it, a
Python name beyond the releasing skeleton's): refilling it can then change nothing anyone sees.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["ReadPool", "trim_freed_memory"]


class ReadPool:
    """Whole CPU storages released by [`give`][], handed out by [`take`][] (the smallest that fits, so a layer
    loaded largest tensor first takes back storages of its own sizes), dropped by [`drop`][]."""

    def __init__(self) -> None:
        self._free: list[torch.UntypedStorage] = []

    def __len__(self) -> int:
        return len(self._free)

    @property
    def nbytes(self) -> int:
        """The bytes held for the next [`take`][]."""
        return sum(storage.nbytes() for storage in self._free)

    def give(self, tensor: torch.Tensor, references: int) -> bool:
        """Keep ``tensor``'s whole storage for a later [`take`][] when the caller's ``references`` to the tensor
        object (a module's entry, a local name) are its only holders (`only_holder`); returns whether it was
        kept."""
        if not only_holder(tensor, references + 1):  # + this method's argument
            return False
        self._free.append(tensor.untyped_storage())
        return True

    def take(self, shape: Iterable[int], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous CPU tensor of ``shape`` and ``dtype``: at the start of the smallest kept
        storage that holds it (removed from the pool), else new memory."""
        shape = tuple(shape)
        needed = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        fits = [i for i, storage in enumerate(self._free) if storage.nbytes() >= needed]
        if not needed or not fits:
            return torch.empty(shape, dtype=dtype)
        storage = self._free.pop(min(fits, key=lambda i: self._free[i].nbytes()))
        return torch.empty(0, dtype=dtype).set_(storage, 0, shape)

    def drop(self) -> None:
        """Free what no load took."""
        self._free.clear()


def only_holder(tensor: torch.Tensor, references: int) -> bool:
    """True when ``tensor`` is a CPU tensor whose storage no other tensor shares (a view, a copy a caller kept) and
    that no Python name holds beyond the caller's ``references`` (and this call's): refilling its storage cannot
    change anything another holder sees."""
    if sys.getrefcount(tensor) > references + 2:  # + this function's argument and getrefcount's
        return False
    if tensor.device.type != "cpu":
        return False
    storage = tensor.untyped_storage()
    return torch._C._storage_Use_Count(storage._cdata) <= 2  # the tensor's and this function's storage object


@functools.lru_cache(maxsize=1)
def _libc_trim() -> Any:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def trim_freed_memory() -> None:
    """glibc's ``malloc_trim(0)``: after a layer is released, its freed memory goes back to the system. Without it
    glibc keeps it (the mmap threshold grows to the size of the last freed block, so the next layer's tensors come
    from the heap, which only shrinks from the top): measured, 3x the memory of one layer held after a few."""
    trim = _libc_trim()
    if trim is not None:
        trim(0)

"""The next layer's tensors read into host memory while this one computes: `ReadAhead`.

A skeleton that computes on a GPU ([`Skeleton`][..skeleton.Skeleton], ``read_ahead``) reads the
layer it will load next in a background thread as soon as it is told
([`Skeleton.prefetch`][..skeleton.Skeleton.prefetch]): the thread's positioned reads copy the bytes from the page cache
(or the disk) into pinned buffers without holding the GIL, while the main thread queues this layer's kernels. The
load then only joins the thread and queues the copies to the device. A read that failed raises in the load, as it
would have there; what the load does not ask for is dropped. On the CPU the skeleton reads at the load instead (its
[`ReadPool`][..pool.ReadPool] recycles the released layer's memory, which a read ahead would
double).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

__all__ = ["ReadAhead"]


class ReadAhead:
    """``read(name)`` for every name of ``names``, in a daemon thread started now; `take` joins it."""

    def __init__(self, names: list[str], read: Callable[[str], torch.Tensor | None]):
        self.names = list(names)
        self._found: dict[str, torch.Tensor | None] = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(read,), daemon=True, name="lightprune-read-ahead")
        self._thread.start()

    def _run(self, read: Callable[[str], torch.Tensor | None]) -> None:
        try:
            for name in self.names:
                self._found[name] = read(name)
        except BaseException as err:  # noqa: BLE001 - raised by take, in the thread that loads
            self._error = err

    def take(self, wanted: list[str]) -> dict[str, torch.Tensor | None]:
        """Wait for the reads; {name: the tensor read (None: one transformers converts at the load)} of ``wanted``
        that were read ahead. The thread's error, if it had one and any of ``wanted`` was its to read, is raised."""
        self._thread.join()
        if self._error is not None and set(wanted) & set(self.names):
            raise self._error
        return {name: self._found[name] for name in wanted if name in self._found}

    def wait(self) -> None:
        """Let the thread finish (its reads are dropped)."""
        self._thread.join()

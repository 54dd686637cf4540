"""What lightprune keeps quiet, unless the run is verbose (``LIGHTPRUNE_VERBOSE=1``, which the command's
``--verbose`` sets):

- third-party notices that say nothing about the run (`DROPPED_LOGS`, `DROPPED_WARNINGS`), dropped by
  `install_filters`: at ``import lightprune`` for the Python API, and by the command
  (`lightprune.cli.quiet`, which also sets its environment defaults);
- transformers' progress bars over lightprune's own internal saves and reloads (an export's save and its
  verification's reload, a skeleton's weight conversion): `quiet_progress`.

A leaf module: transformers is imported only inside `quiet_progress`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator

__all__ = ["DROPPED_LOGS", "DROPPED_WARNINGS", "VERBOSE_ENV", "dropped", "install_filters", "quiet_progress",
           "remove_filters", "verbose"]

VERBOSE_ENV = "LIGHTPRUNE_VERBOSE"
#: logger name -> message fragments dropped from it
DROPPED_LOGS: dict[str, tuple[str, ...]] = {
    "lightning.pytorch.utilities.rank_zero": ("try installing [litlogger]",),
    "bitsandbytes.backends.cpu.ops": ("Failed to load CPU gemm_4bit_forward",),
    "DeepSpeed": ("Setting accelerator to CPU",),
}
#: (category, message regex) of the warnings dropped
DROPPED_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated"),
    (Warning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
)


class _Drop(logging.Filter):
    def __init__(self, fragments: tuple[str, ...]):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


def install_filters() -> None:
    """Drop the notices of `DROPPED_LOGS` and `DROPPED_WARNINGS` in this process (idempotent), leaving
    the environment alone: what ``import lightprune`` does for the Python API unless verbose.

    Filters sit on the named loggers themselves, so they hold when a library configures its logger later (at its
    import); install before the libraries are imported to catch import-time notices.
    """
    for name, fragments in DROPPED_LOGS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) for f in logger.filters):
            logger.addFilter(_Drop(fragments))
    for category, message in DROPPED_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


def verbose(environ=os.environ) -> bool:
    """``LIGHTPRUNE_VERBOSE`` set to a true value."""
    return environ.get(VERBOSE_ENV, "").lower() in ("1", "true", "yes")


def remove_filters() -> None:
    """Undo `install_filters` (a verbose command in a process whose ``import lightprune`` installed them)."""
    for name in DROPPED_LOGS:
        logger = logging.getLogger(name)
        logger.filters[:] = [f for f in logger.filters if not isinstance(f, _Drop)]
    dropped = {(category, message) for category, message in DROPPED_WARNINGS}
    warnings.filters[:] = [f for f in warnings.filters
                           if not (f[0] == "ignore" and (f[2], getattr(f[1], "pattern", f[1])) in dropped)]


@contextlib.contextmanager
def dropped(logger: str, *fragments: str) -> Iterator[None]:
    """Inside the block, messages of ``logger`` holding any of ``fragments`` are dropped, unless verbose (an inner
    trainer's banner: Lightning prints it once per Trainer)."""
    log = logging.getLogger(logger)
    drop = _Drop(fragments)
    if not verbose():
        log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """transformers' progress bars ("Loading weights", "Writing model shards") off inside the block, unless
    verbose; their previous state after it."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if not verbose():
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()

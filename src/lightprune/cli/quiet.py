"""Quiet runs: third-party notices that say nothing about the user's run are dropped from the ``lightprune``
command's output, unless it runs verbose (``--verbose`` or ``LIGHTPRUNE_VERBOSE=1``).

Dropped, each by its logger and message (nothing else from those loggers): Lightning's litlogger tip,
bitsandbytes' "Failed to load CPU gemm_4bit_forward" (an optional kernel package), DeepSpeed's "Setting
accelerator to CPU", and the deprecation warnings transformers (``is_gradient_checkpointing``) and Lightning
(``LeafSpec``) emit for their own internal calls. transformers' own progress bars ("Loading weights", "Writing
model shards": a checkpoint's save and reload, which the export's summary reports) are off
(``HF_HUB_DISABLE_PROGRESS_BARS``, which transformers reads at import, unless the environment sets it).
"""

from __future__ import annotations

import logging
import os
import warnings

__all__ = ["DROPPED_LOGS", "DROPPED_WARNINGS", "QUIET_ENV", "VERBOSE_ENV", "install", "is_verbose"]

VERBOSE_ENV = "LIGHTPRUNE_VERBOSE"
#: environment defaults of a quiet run (set before the libraries are imported, kept when already set)
QUIET_ENV: dict[str, str] = {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}
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


def is_verbose(argv: list[str], environ=os.environ) -> bool:
    """``--verbose`` among the arguments or ``LIGHTPRUNE_VERBOSE`` set to a true value."""
    return "--verbose" in argv or environ.get(VERBOSE_ENV, "").lower() in ("1", "true", "yes")


def install() -> None:
    """Drop the notices of :data:`DROPPED_LOGS` and :data:`DROPPED_WARNINGS` in this process (idempotent).

    Filters sit on the named loggers themselves, so they hold when a library configures its logger later (at its
    import); install before the libraries are imported to catch import-time notices.
    """
    for name, fragments in DROPPED_LOGS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) for f in logger.filters):
            logger.addFilter(_Drop(fragments))
    for category, message in DROPPED_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)

"""Quiet runs: third-party notices that say nothing about the user's run are dropped from the ``lightprune``
command's output, and from the Python API's (``import lightprune`` installs the same filters, not the environment
defaults), unless it runs verbose (``--verbose`` or ``LIGHTPRUNE_VERBOSE=1``).

Dropped (`lightprune.core.notices`), each by its logger and message (nothing else from those loggers):
Lightning's litlogger tip, bitsandbytes' "Failed to load CPU gemm_4bit_forward" (an optional kernel package),
DeepSpeed's "Setting accelerator to CPU", and the deprecation warnings transformers (``is_gradient_checkpointing``)
and Lightning (``LeafSpec``) emit for their own internal calls. transformers' own progress bars ("Loading weights", "Writing
model shards": a checkpoint's save and reload, which the export's summary reports) are off
(``HF_HUB_DISABLE_PROGRESS_BARS``, which transformers reads at import, unless the environment sets it).
"""

from __future__ import annotations

import logging
import os

from lightprune.core.notices import (
    DROPPED_LOGS,
    DROPPED_WARNINGS,
    VERBOSE_ENV,
    install_filters,
    remove_filters,
    verbose,
)

__all__ = ["DROPPED_LOGS", "DROPPED_WARNINGS", "QUIET_ENV", "SIGTERM_LOG", "VERBOSE_ENV", "install", "install_filters",
           "is_verbose",
           "remove_filters"]

#: environment defaults of a quiet run (set before the libraries are imported, kept when already set)
QUIET_ENV: dict[str, str] = {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def is_verbose(argv: list[str], environ=os.environ) -> bool:
    """``--verbose`` among the arguments or ``LIGHTPRUNE_VERBOSE`` set to a true value."""
    return "--verbose" in argv or verbose(environ)


#: Lightning's own line for a SIGTERM (its logger, the start of its message): the command says it in its own line
SIGTERM_LOG = ("lightning.pytorch.trainer.connectors.signal_connector", "Received SIGTERM")


def _not_sigterm(record: logging.LogRecord) -> bool:
    return SIGTERM_LOG[1] not in str(record.msg)  # "[rank: 0] Received SIGTERM: 15"


def install() -> None:
    """Drop the notices of `DROPPED_LOGS` and `DROPPED_WARNINGS` in this process and set
    `QUIET_ENV` (idempotent): the command's quiet run. Lightning's "[rank: 0] Received SIGTERM: 15"
    (`SIGTERM_LOG`) is dropped too: the command's own line says the signal, what it was doing and what it kept."""
    install_filters()
    logger = logging.getLogger(SIGTERM_LOG[0])
    if _not_sigterm not in logger.filters:
        logger.addFilter(_not_sigterm)
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)

"""Optional dependencies: which extra of ``pip install 'lightprune[...]'`` brings each one.

A CPU install needs none of them. A feature that needs one imports it through `require`, which raises
`MissingExtraError` with one line naming the extra to install (the CLI prints that line and exits 2).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from lightprune.core.errors import register_error

__all__ = ["EXTRAS", "MissingExtraError", "missing", "require", "missing_deepspeed"]

#: extra -> (the module it provides, what needs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "deepspeed": ("deepspeed", "DeepSpeed ZeRO strategies"),
    "qlora": ("bitsandbytes", "4-bit base models (QLoRA) and the adamw8bit optimizer"),
    "triton": ("triton", "the Triton path-sparse attention kernel"),
    "eval": ("lm_eval", "lm-evaluation-harness tasks"),
    "merging": ("scipy.optimize", "M-SMoE's neuron alignment (the Hungarian weight matching)"),
}


@register_error
class MissingExtraError(ImportError):
    """A feature's optional dependency is not installed; the message names the extra that installs it."""


def missing(extra: str, feature: str) -> MissingExtraError:
    """The error for ``feature`` when the module of ``extra`` (one of `EXTRAS`) is not installed."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; lightprune's extras are {sorted(EXTRAS)}")
    module = EXTRAS[extra][0]
    return MissingExtraError(f"{feature} needs {module!r}, which is not installed: pip install 'lightprune[{extra}]'")


def require(extra: str, feature: str) -> ModuleType:
    """Import the module of ``extra`` for ``feature``, or raise `missing`'s error."""
    error = missing(extra, feature)
    try:
        return importlib.import_module(EXTRAS[extra][0])
    except ImportError as err:
        raise error from err


def missing_deepspeed(err: BaseException) -> MissingExtraError | None:
    """The one-line error for Lightning's "you must have DeepSpeed installed" (raised when a DeepSpeed strategy is
    built without deepspeed), else None."""
    if "must have DeepSpeed installed" in str(err):
        return missing("deepspeed", "a DeepSpeed strategy")
    return None

"""The argument checks lightprune repeats: one helper each, one wording for the error.

A leaf: it imports nothing from lightprune. Every error names the argument and the bad value (and the
allowed ones).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

__all__ = ["check_ratio", "check_atol", "check_choice", "check_positive_int"]


def check_ratio(value: Any, name: str = "ratio") -> float:
    """A pruning fraction in [0, 1), as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return float(value)


def check_atol(value: Any) -> float | None:
    """A verification tolerance: None (the default of the dtype) or a positive finite number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
        raise ValueError(f"atol must be positive, got {value!r}")
    return float(value)


def check_choice(name: str, value: Any, allowed: Iterable[Any]) -> Any:
    """``value`` if it is one of ``allowed``."""
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def check_positive_int(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    """A positive integer (``None`` too when ``allow_none``)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer{' or None' if allow_none else ''}, got {value!r}")
    return int(value)

"""The argument checks lightprune repeats: one helper each, one wording for the error.

A leaf: it imports nothing from lightprune. Every error names the argument and the bad value (and the
allowed ones).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

__all__ = ["check_ratio", "check_atol", "check_choice", "check_each", "check_positive_int", "check_non_negative_int"]


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


def check_each(name: str, values: Any, allowed: Iterable[Any]) -> tuple:
    """``values`` (a list or tuple) as a tuple if each is one of ``allowed``."""
    allowed = list(allowed)
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be a list of {allowed}, got {values!r}")
    values = tuple(values)
    bad = [value for value in values if value not in allowed]
    if bad:
        raise ValueError(f"{name} must each be one of {allowed}, got {bad[0]!r}")
    return values


def check_non_negative_int(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    """A non-negative integer (``None`` too when ``allow_none``)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < 0:
        raise ValueError(f"{name} must be a non-negative integer{' or None' if allow_none else ''}, got {value!r}")
    return int(value)


def check_positive_int(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    """A positive integer (``None`` too when ``allow_none``)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer{' or None' if allow_none else ''}, got {value!r}")
    return int(value)

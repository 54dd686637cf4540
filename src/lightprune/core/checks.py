"""The argument checks lightprune repeats: one helper each, one wording for the error.

A leaf: it imports nothing from lightprune (nor NumPy or torch). Every error names the argument and the bad value
(and the allowed ones).

A number is what :func:`real_number` accepts: a Python int or float, a NumPy integer or floating scalar, or a
0-d NumPy array or torch tensor of an integer or floating dtype (``numpy.float32(0.5)``, ``torch.tensor(0.5)``);
never a bool of any kind (Python, NumPy, a bool tensor), a complex number or a string. A float narrower than
Python's is read as written: ``numpy.float32(0.7)`` holds 0.699999988, and is 0.7 here (the shortest decimal its
dtype rounds to the same value), so it selects what ``0.7`` selects. An integer is what :func:`integer` accepts:
such a number with an integral value (``2``, ``numpy.int64(2)``, ``2.0``). JSON files are checked by
:func:`lightprune.core.jsonio.strict_int` instead, which refuses ``2.0``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable

__all__ = ["check_ratio", "check_atol", "check_choice", "check_each", "check_positive_int", "check_non_negative_int",
           "check_interval", "check_number", "integer", "real_number"]


def real_number(value: Any) -> int | float | None:
    """``value`` as a Python int or float when it is a number (see the module docstring), else None."""
    if isinstance(value, bool) or "bool" in str(getattr(value, "dtype", "")):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return _as_written(value, float(value)) if hasattr(value, "dtype") else float(value)
    shape, kind = getattr(value, "shape", None), str(getattr(value, "dtype", ""))
    if shape is not None and tuple(shape) == () and ("int" in kind or "float" in kind) and hasattr(value, "item"):
        number = real_number(value.item())  # a 0-d array or tensor: its Python scalar
        return _as_written(value, number) if isinstance(number, float) else number
    return None


def _as_written(value: Any, number: float) -> float:
    """``number``, the widened value of a float ``value`` (NumPy or torch), or where ``value``'s dtype is narrower
    than a Python float, the shortest decimal that rounds to the same ``value`` in that dtype."""
    size = value.element_size() if hasattr(value, "element_size") else getattr(value, "itemsize", 8)
    if size >= 8 or not math.isfinite(number):
        return number
    rounded = (lambda x: value.new_tensor(x).item()) if hasattr(value, "new_tensor") else \
        (lambda x: float(value.dtype.type(x)))
    for digits in range(1, 18):
        written = float(f"{number:.{digits}g}")
        if rounded(written) == number:
            return written
    return number


def integer(value: Any) -> int | None:
    """``value`` as an int when it is a finite number with an integral value (``2.0`` too), else None."""
    number = real_number(value)
    if number is None or not math.isfinite(number) or int(number) != number:
        return None
    return int(number)


def check_interval(name: str, value: Any, low: float, high: float, bounds: str = "[]") -> float:
    """A number in the interval from ``low`` to ``high``, as a float; ``bounds`` the brackets (``"[)"``: ``low``
    included, ``high`` not). NaN is never inside."""
    number = real_number(value)
    inside = number is not None and (low <= number if bounds[0] == "[" else low < number) and \
        (number <= high if bounds[1] == "]" else number < high)
    if not inside:
        raise ValueError(f"{name} must be in {bounds[0]}{low:g}, {high:g}{bounds[1]}, got {value!r}")
    return float(number)


def check_number(name: str, value: Any) -> float:
    """A finite number, as a float."""
    number = real_number(value)
    if number is None or not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(number)


def check_ratio(value: Any, name: str = "ratio") -> float:
    """A pruning fraction in [0, 1), as a float."""
    return check_interval(name, value, 0, 1, "[)")


def check_atol(value: Any) -> float | None:
    """A verification tolerance: None (the default of the dtype) or a positive finite number."""
    if value is None:
        return None
    number = real_number(value)
    if number is None or not 0 < number < math.inf:
        raise ValueError(f"atol must be positive, got {value!r}")
    return float(number)


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
    number = integer(value)
    if number is None or number < 0:
        raise ValueError(f"{name} must be a non-negative integer{' or None' if allow_none else ''}, got {value!r}")
    return number


def check_positive_int(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    """A positive integer (``None`` too when ``allow_none``)."""
    if value is None and allow_none:
        return None
    number = integer(value)
    if number is None or number < 1:
        raise ValueError(f"{name} must be a positive integer{' or None' if allow_none else ''}, got {value!r}")
    return number

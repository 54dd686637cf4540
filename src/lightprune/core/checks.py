"""The argument checks lightprune repeats: one helper each, one wording for the error.

A leaf: it imports nothing from lightprune (nor NumPy or torch). Every error names the argument and the bad value
(and the allowed ones).

A number is what `real_number` accepts: a Python int or float, a ``Fraction`` or ``Decimal``, a NumPy integer
or floating scalar, or a 0-d NumPy array or torch tensor of an integer or floating dtype (``numpy.float32(0.5)``,
``torch.tensor(0.5)``); never a bool of any kind (Python, NumPy, a bool tensor), a complex number, a string, an
array of one element (``torch.tensor([0.5])``), a tensor on the meta device (it has a shape and a dtype, no value) or
NumPy's masked value (``numpy.ma.masked``, a masked element of a masked array: a missing value, whose ``item()`` is
its hidden fill, 0.0): a refusal says which of these it got. A float narrower than
Python's is read as written: ``numpy.float32(0.7)`` holds 0.699999988, and is 0.7 here (the shortest decimal its
dtype rounds to the same value), so it selects what ``0.7`` selects. An integer is what `integer` accepts:
such a number with an integral value (``2``, ``numpy.int64(2)``, ``2.0``). JSON files are checked by
`lightprune.core.jsonio.strict_int` instead, which refuses ``2.0``.

A ratio becomes a count exactly (`ratio_count`): ``0.29`` of 100 experts is 29, where binary floating point
gives ``math.floor(0.29 * 100) == 28``.

Text that lightprune writes to a UTF-8 file (a plan, a manifest, a model card) is checked before it is: a string
holding half of a UTF-16 surrogate pair is refused naming its key path (`non_utf8`, `check_utf8`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Any, Callable, Iterable

__all__ = ["check_ratio", "check_atol", "check_bool", "check_choice", "check_each", "check_positive_int",
           "check_non_negative_int", "check_interval", "check_number", "check_utf8", "exact_ratio", "integer",
           "non_utf8", "not_a_number", "ratio_count", "real_number"]


def real_number(value: Any) -> int | float | None:
    """``value`` as a Python int or float when it is a number (see the module docstring), else None."""
    if isinstance(value, bool) or "bool" in str(getattr(value, "dtype", "")) or _valueless(value):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, Decimal):  # not a numbers.Real, but a number as exact as a Fraction
        return None if value.is_snan() else float(value)
    if isinstance(value, numbers.Real):
        return _as_written(value, float(value)) if hasattr(value, "dtype") else float(value)
    shape, kind = getattr(value, "shape", None), str(getattr(value, "dtype", ""))
    if shape is not None and tuple(shape) == () and ("int" in kind or "float" in kind) and hasattr(value, "item"):
        number = real_number(value.item())  # a 0-d array or tensor: its Python scalar
        return _as_written(value, number) if isinstance(number, float) else number
    return None


def _masked(value: Any) -> bool:
    """Whether ``value`` is a NumPy masked array whose every element is masked (``numpy.ma.masked``, a masked element
    of a masked array)."""
    if not type(value).__module__.startswith("numpy.ma"):
        return False
    mask = getattr(value, "mask", False)
    return bool(getattr(mask, "all", lambda: mask)())


def _meta(value: Any) -> bool:
    """Whether ``value`` is a tensor on the meta device (a shape and a dtype, no data)."""
    return getattr(value, "is_meta", False) is True


def _valueless(value: Any) -> bool:
    return _meta(value) or _masked(value)


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


def not_a_number(value: Any) -> str:
    """Why ``value`` is not a number, for an error message (``""`` when it is one): a bool, a string, an array or
    tensor of some shape, ..."""
    if real_number(value) is not None:
        return ""
    shape = getattr(value, "shape", None)
    if isinstance(value, bool) or "bool" in str(getattr(value, "dtype", "")):
        return "a bool, not a number"
    if isinstance(value, (str, bytes)):
        return f"a string, not a number (write {value} without quotes)" if isinstance(value, str) and _parses(value) \
            else "a string, not a number"
    if shape is not None and tuple(shape) != ():
        kind = "tensor" if hasattr(value, "new_tensor") else "array"
        return f"a{'n' if kind == 'array' else ''} {kind} of shape {list(shape)}, not a number: give a number or a " \
               f"0-d {kind} (x.item())"
    if _meta(value):
        return "a tensor on the meta device, which holds no value, not a number"
    if _masked(value):
        return "NumPy's masked value (a missing value), not a number"
    if isinstance(value, complex) or "complex" in str(getattr(value, "dtype", "")):
        return "a complex number"
    return f"a {type(value).__name__}, not a number"


def non_utf8(value: Any, path: str = "") -> tuple[str, str, str] | None:
    """(where, the string, its first character UTF-8 cannot encode) for the first string in ``value`` (dicts' keys
    and values, lists and tuples, at any depth) that is not UTF-8 text, or None. Such a string holds half of a UTF-16
    surrogate pair (``'\\ud800'``), which a JSON ``\\ud800`` escape and a name's undecodable byte (``'\\udcff'``)
    give: no UTF-8 file can hold it. ``where`` is the key path (``metadata['note'][0]``, below ``path`` when given:
    a top-level key is named bare), or "``path`` key" for a key (``metadata key``)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return None
        except UnicodeEncodeError as err:
            return path or "the value", value, value[err.start]
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if isinstance(value, (list, tuple)) \
        else ()
    for key, item in items:
        found = non_utf8(key, f"{path} key".strip()) if isinstance(key, str) else None
        found = found or non_utf8(item, f"{path}[{key!r}]" if path else str(key))
        if found is not None:
            return found
    return None


def check_utf8(value: Any, holder: str, error: type[Exception] = ValueError, path: str = "") -> None:
    """Raise ``error`` naming the key path when a string in ``value`` is not UTF-8 text (`non_utf8`), before
    ``holder`` ("a plan file (UTF-8 JSON)", what it would be written to) is: writing it would fail there."""
    found = non_utf8(value, path)
    if found is not None:
        where, text, char = found
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise error(f"{where} {shown!r} is not UTF-8 text: it holds {char!r}, half of a UTF-16 surrogate pair without "
                    f"its partner, which {holder} cannot hold; write the character itself, or remove it")


def _parses(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except (TypeError, ValueError):
        return False


def _got(value: Any) -> str:
    """``got <value>`` for a message, with why it is not a number when it is not one."""
    why = not_a_number(value)
    return f"got {value!r}" + (f": {why}" if why and value is not None else "")


def exact_ratio(value: Any) -> Fraction:
    """The fraction a ratio (a number) stands for: an int, ``Fraction`` or ``Decimal`` exactly; a float as the decimal
    it was written as, its shortest repr (``0.29`` is 29/100, not the binary 0.28999999999999998), or, for a float
    that needs 16 or 17 digits (one computed: ``1/3``, ``2/3``), the fraction of denominator at most 10**6 whose
    float it is, when there is one. Anything else (a NaN or an infinity, ``Decimal('Infinity')`` too) is a
    ``ValueError``."""
    if isinstance(value, (Fraction, int)) and not isinstance(value, bool) or \
            isinstance(value, Decimal) and value.is_finite():
        return Fraction(value)
    number = real_number(value)
    if number is None or not math.isfinite(number):
        raise ValueError(f"a ratio must be a finite number, {_got(value)}")
    written = Fraction(repr(float(number)))
    digits = repr(float(number)).split("e")[0].replace("-", "").replace(".", "").strip("0")
    if len(digits) <= 15:  # every decimal of up to 15 digits is the shortest repr of its float
        return written
    simple = Fraction(number).limit_denominator(10**6)
    return simple if float(simple) == number else written


def ratio_count(ratio: Any, total: int, rounding: Callable[[Fraction], int] = math.floor) -> int:
    """``rounding(ratio x total)`` in exact arithmetic (`exact_ratio`): ``ratio_count(0.29, 100) == 29`` and
    ``ratio_count(0.57, 200) == 114``; ``rounding`` is ``math.floor``, ``math.ceil`` or ``round`` (half to even)."""
    return int(rounding(exact_ratio(ratio) * int(total)))


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
        raise ValueError(f"{name} must be in {bounds[0]}{low:g}, {high:g}{bounds[1]}, {_got(value)}")
    return float(number)


def check_number(name: str, value: Any) -> float:
    """A finite number, as a float."""
    number = real_number(value)
    if number is None or not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, {_got(value)}")
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
        raise ValueError(f"atol must be positive, {_got(value)}")
    return float(number)


def check_bool(value: Any, name: str) -> bool:
    """``value`` when it is a bool: Python's ``True`` or ``False``, or a NumPy bool scalar (as a Python bool). Anything
    else is refused naming ``name`` and the value, never read as a truth value: ``overwrite="no"`` is a non-empty
    string, which ``if overwrite:`` takes as yes; ``1``, ``None`` and a tensor are refused too."""
    if isinstance(value, bool):
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool"):
        return bool(value)
    raise ValueError(f"{name} must be True or False, got {value!r}")


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
    return _int_at_least(name, value, 0, "non-negative", allow_none)


def check_positive_int(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    """A positive integer (``None`` too when ``allow_none``)."""
    return _int_at_least(name, value, 1, "positive", allow_none)


def _int_at_least(name: str, value: Any, low: int, kind: str, allow_none: bool) -> int | None:
    """``value`` as an integer of at least ``low`` (``kind``: how the message says it), or None when it is None and
    ``allow_none``."""
    if value is None and allow_none:
        return None
    number = integer(value)
    if number is None or number < low:
        raise ValueError(f"{name} must be a {kind} integer{' or None' if allow_none else ''}, {_got(value)}")
    return number

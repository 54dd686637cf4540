"""The closest known name to a mistyped one, for one-line error messages: `` (did you mean 'X'?)``."""

from __future__ import annotations

import difflib
from typing import Any

__all__ = ["did_you_mean"]


def did_you_mean(value: Any, known: Any, cutoff: float = 0.6) -> str:
    """`` (did you mean 'X'?)`` for the name of ``known`` (each as ``str``) closest to ``value``: the one equal to it
    but for case, else the closest by difflib (at least ``cutoff`` alike); ``""`` when none is that close or
    ``value`` is not a string."""
    if not isinstance(value, str):
        return ""
    names = [str(k) for k in known]
    close = [name for name in names if name.casefold() == value.casefold()] or \
        difflib.get_close_matches(value, names, n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""

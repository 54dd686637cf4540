"""Errors shared by both pruning axes (expert plans and width plans).

A leaf module: it imports nothing from lightprune.
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["PlanError", "ERRORS", "LISTED", "listed", "listed_text", "register_error"]

#: how many items an error message lists before it says how many more there are
LISTED = 8


def listed(values: Iterable[Any], limit: int = LISTED) -> str:
    """``values`` as a list in an error message: the first ``limit``, then how many more (``[3, 4, 5, 6, 7, 8, 9, 10,
    ... and 99,989 more]``: a plan naming 100,000 layers gives one short line, not a 700 KB one)."""
    values = list(values)
    if len(values) <= limit:
        return repr(values)
    return f"[{', '.join(map(repr, values[:limit]))}, ... and {len(values) - limit:,} more]"


def listed_text(items: Iterable[str], limit: int = LISTED) -> str:
    """``items``, texts written for a sentence (tensor names, ``name [8, 2] on disk``), joined by commas as they are:
    the first ``limit``, then ``, and N more``. `listed` writes values as a Python list (brackets, each
    value's repr), which would quote such phrases."""
    items = list(items)
    more = f", and {len(items) - limit:,} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


class PlanError(ValueError):
    """A plan that does not fit the model, or breaks a layer's floor."""


#: error classes (besides ValueError and OSError) that mean a bad input, not a bug: the command reports them in
#: one line; modules that define such a class register it (:func:`register_error`)
ERRORS: list[type[BaseException]] = []


def register_error(cls: type[BaseException]) -> type[BaseException]:
    """Class decorator: ``lightprune`` reports ``cls`` as a one-line error, without a traceback."""
    if cls not in ERRORS:
        ERRORS.append(cls)
    return cls

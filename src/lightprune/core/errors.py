"""Errors shared by both pruning axes (expert plans and width plans).

A leaf module: it imports nothing from lightprune.
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["PlanError", "ERRORS", "listed", "register_error"]

#: how many items an error message lists before it says how many more there are
LISTED = 8


def listed(values: Iterable[Any], limit: int = LISTED) -> str:
    """``values`` as a list in an error message: the first ``limit``, then how many more (``[3, 4, 5, 6, 7, 8, 9, 10,
    ... and 99,989 more]``: a plan naming 100,000 layers gives one short line, not a 700 KB one)."""
    values = list(values)
    if len(values) <= limit:
        return repr(values)
    return f"[{', '.join(map(repr, values[:limit]))}, ... and {len(values) - limit:,} more]"


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

"""Errors shared by both pruning axes (expert plans and width plans).

A leaf module: it imports nothing from lightprune.
"""

from __future__ import annotations

__all__ = ["PlanError", "ERRORS", "register_error"]


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

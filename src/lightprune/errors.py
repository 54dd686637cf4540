"""Errors shared by both pruning axes (expert plans and width plans).

A leaf module: it imports nothing from lightprune.
"""

from __future__ import annotations

__all__ = ["PlanError"]


class PlanError(ValueError):
    """A plan that does not fit the model, or breaks a layer's floor."""

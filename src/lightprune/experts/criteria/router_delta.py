"""Router delta: the router sensitivity of an adapter fit, as a criterion (router sensitivity ("Router Sensitivity
Under Lightweight Fine-Tuning Identifies Prunable Experts in Mixture-of-Experts Models", arXiv 2608.07890),
sections 3.2-3.4, Eqs. 4, 3 and 5).

The scores are those the RouterDelta callback measures at the end of ``lightprune fit``
([`lightprune.experts.sensitivity`][...sensitivity]: weight, signed weight or logit delta); the criterion reads them
from the run and accumulates nothing from a calibration pass.
"""

from __future__ import annotations

from typing import ClassVar

from lightprune.experts.criteria.from_data import FitCriterion
from lightprune.experts.criteria.registry import register_criterion

__all__ = ["RouterDeltaCriterion"]


@register_criterion("router_delta")
class RouterDeltaCriterion(FitCriterion):
    """Router sensitivity of an adapter fit (router sensitivity Eqs. 4, 3 and 5): weight, signed weight or logit
    delta."""

    producer: ClassVar[str] = "RouterDelta"

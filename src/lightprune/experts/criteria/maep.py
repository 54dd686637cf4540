"""MAEP: Delta-H on text tokens against Delta-H on low-attention vision tokens, in one score per expert (MAEP
("Modality-Aware Expert Pruning for MoE-Based Multimodal Large Language Models", arXiv 2611.05927), section 5.3).

    s = (1 - alpha) z~_text - alpha z~_low,

z~ the log-z-scored Delta-H of each subset (`lightprune.experts.criteria.delta_h`); ``alpha=None`` takes the
closed-form alpha of section 5.3. The combination and the alpha:
[`lightprune.experts.maep.maep_scores`][...maep.maep_scores]. It
reads the ``delta_h`` the observed pass collects on ``text`` and ``vision_low_attn`` and accumulates nothing of its
own.
"""

from __future__ import annotations

from typing import Any

from lightprune.core.checks import check_interval
from lightprune.experts.criteria.from_data import CalibrationCriterion
from lightprune.experts.criteria.registry import register_criterion
from lightprune.experts.maep import maep_scores
from lightprune.experts.scores import ExpertScores

__all__ = ["MAEP"]


@register_criterion("maep")
class MAEP(CalibrationCriterion):
    """MAEP: s = (1 - alpha) z~_text - alpha z~_low of Delta-H; ``alpha=None`` takes the closed form."""

    def __init__(self, alpha: float | None = None, subset: str = "all"):
        super().__init__(subset)
        self.alpha = None if alpha is None else check_interval("alpha", alpha, 0, 1)

    def score_stats(self, stats: Any) -> ExpertScores:
        return maep_scores(stats, alpha=self.alpha)[0]

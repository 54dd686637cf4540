"""Calibration statistics: every calibration criterion for every token subset, from one observed pass.

May import: models, observe, experts.scores / experts.ranking and the shared leaves.
"""

from lightprune.experts.calibration.collect import DEFAULT_CRITERIA, ExpertObserver, collect_expert_stats
from lightprune.experts.calibration.result import CRITERIA, NEGATED, SUBSETS, CalibrationStats

__all__ = ["CalibrationStats", "CRITERIA", "SUBSETS", "NEGATED", "DEFAULT_CRITERIA", "ExpertObserver",
           "collect_expert_stats"]

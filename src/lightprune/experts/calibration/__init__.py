"""Calibration statistics: every calibration criterion for every token subset, from one observed pass (in memory,
or a checkpoint directory one decoder layer at a time: :mod:`.sequential`).

May import: models, checkpoints, observe, experts.scores / experts.ranking and the shared leaves.
"""

from lightprune.experts.calibration.collect import collect_expert_stats, collect_model_stats
from lightprune.experts.calibration.observer import DEFAULT_CRITERIA, ExpertObserver
from lightprune.experts.calibration.result import CRITERIA, NEGATED, SUBSETS, CalibrationStats
from lightprune.experts.calibration.sequential import collect_checkpoint_stats

__all__ = ["CalibrationStats", "CRITERIA", "SUBSETS", "NEGATED", "DEFAULT_CRITERIA", "ExpertObserver",
           "collect_expert_stats", "collect_model_stats", "collect_checkpoint_stats"]

"""Calibration statistics: every calibration criterion for every token subset, from one observed pass (in memory,
or a checkpoint directory one decoder layer at a time).

- `observer` (`ExpertObserver`: the hooks of the pass), [`collect`][.collect]
  ([`collect_expert_stats`][.collect.collect_expert_stats], a model or a checkpoint directory), `feed` (one batch
  fed to the pass: its one driver), `sequential` (the checkpoint one decoder layer at a time);
- `observed` (`ObservedBatch`: one layer's view of one batch, computed once: padding, routing state, removal effect
  and re-runs (`reruns`), Gram matrix), `layer_statistics` (a layer's statistics fed one batch: what the criteria
  accumulate, each criterion's `Statistic`, found through the criteria's one table,
  `lightprune.experts.criteria.registry`);
- [`result`][.result] ([`CalibrationStats`][.result.CalibrationStats]), `resume` (a resumable state), `subsets` (token
  subsets), `validation` (the paper's validations of Delta-H).

May import: models, checkpoints, observe, experts.criteria / experts.scores / experts.ranking and core. Its names
are imported on first use (the registry is read without torch).
"""

from __future__ import annotations

from lightprune.core.lazy import lazy_package

_NAMES = {
    "CalibrationStats": "lightprune.experts.calibration.result",
    "CRITERIA": "lightprune.experts.calibration.result",
    "SUBSETS": "lightprune.experts.calibration.result",
    "DEFAULT_CRITERIA": "lightprune.experts.criteria.registry",
    "MERGE_STATISTICS": "lightprune.experts.criteria.registry",
    "register_statistic": "lightprune.experts.criteria.registry",
    "available_statistics": "lightprune.experts.criteria.registry",
    "Statistic": "lightprune.experts.criteria.statistic",
    "ObservedBatch": "lightprune.experts.calibration.observed",
    "ExpertObserver": "lightprune.experts.calibration.observer",
    "collect_expert_stats": "lightprune.experts.calibration.collect",
    "collect_model_stats": "lightprune.experts.calibration.collect",
    "collect_checkpoint_stats": "lightprune.experts.calibration.sequential",
}
__all__ = lazy_package(__name__, _NAMES)

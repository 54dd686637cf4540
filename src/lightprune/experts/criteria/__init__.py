"""Expert-importance criteria behind one registry.

Weight-only criteria (AIMER ("AIMER: Calibration-Free Task-Agnostic MoE Pruning", arXiv 2603.18492) and its
baselines) score a model from its weights alone::

    imp = lp.score_weights(model, "aimer")          # also "magnitude", "router_norm", "random"
    plan = lp.select_experts(imp, ratio=0.5)

| name | raw value | pruned first | source |
|---|---|---|---|
| aimer | ||w||_1 / (sqrt(N) ||w||_2) | largest | AIMER, section 4.2, eq. (5) |
| magnitude | ||w||_2 (Frobenius) | smallest | AIMER, section 5 baselines |
| router_norm | ||W_r[e]||_2 | smallest | lightprune's own baseline (W_r: AIMER section 3) |
| random | U(0, 1), seeded | smallest | AIMER, section 5 baselines |

``w`` is one expert's flattened gate, up and down weights. Criteria that need data register in the same
registry (:mod:`.calibration`): ``frequency``, ``seer``, ``ean``, ``reap``, ``routing_kl``, ``delta_h``,
``delta_h_promoted`` and ``maep`` read the run's calibration statistics, ``router_delta`` an adapter fit's
scores; ``available_criteria(needs_data=True)`` lists them. The merging methods ``hc_smoe`` and ``m_smoe``
(:mod:`.merge_methods`) are named the same way and give a MergePlan instead of scores.

May import: models, checkpoints, experts (scores, calibration, maep, merging) and core. Its names are
imported on first use (the registry is read without torch).
"""

from __future__ import annotations

from lightprune.core.lazy import lazy_attributes

_NAMES = {
    **{name: "lightprune.experts.criteria.registry" for name in (
        "CRITERIA", "register_criterion", "unregister_criterion", "get_criterion", "get_criterion_class",
        "available_criteria")},
    **{name: "lightprune.experts.criteria.scoring" for name in (
        "score_weights", "score_model_weights", "score_checkpoint", "weight_criterion")},
    "Criterion": "lightprune.experts.criteria.base",
    "CriterionNeedsDataError": "lightprune.experts.criteria.base",
    "AIMER": "lightprune.experts.criteria.aimer",
    "Magnitude": "lightprune.experts.criteria.magnitude",
    "RouterNorm": "lightprune.experts.criteria.router_norm",
    "RandomCriterion": "lightprune.experts.criteria.random",
    **{name: "lightprune.experts.criteria.calibration" for name in (
        "CalibrationCriterion", "FitCriterion", "MAEP", "RouterDeltaCriterion")},
    **{name: "lightprune.experts.criteria.merge_methods" for name in ("MergeMethod", "HCSMoE", "MSMoE")},
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_attributes(__name__, _NAMES)

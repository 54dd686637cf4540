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

``w`` is one expert's flattened gate, up and down weights. Criteria that need data are declared in the same
table (`registry`) and answer ``available_criteria(needs_data=True)``: the calibration criteria read the run's
calibration statistics, ``router_delta`` an adapter fit's scores; the merging methods ``hc_smoe`` and ``m_smoe``
are named the same way and give a MergePlan instead of scores.

One module per criterion (or per family of criteria read off the same sums), each of the same shape: its docstring
with the formula and the paper, its `Statistic` (what the observed calibration pass accumulates
for it, named ``STATISTIC``; weight criteria have none), its class (scores and sign) registered with
``@register_criterion``: `aimer`, `magnitude`, `router_norm`, `random` (weights);
`token_sums` (frequency, SEER, EAN, REAP), `routing_kl`, `delta_h` (Delta-H and its promoted
variant), `maep` (calibration); `router_delta` (a fit); `merge_methods` (HC-SMoE, M-SMoE). The
shared parts: [`base`][.base] and `from_data` (the classes), `statistic` (the Statistic shape),
`weights` (per-expert weight norms), [`scoring`][.scoring] (``score_weights``).

May import: models, checkpoints, observe, experts (scores, maep, merging) and core; never experts.calibration (the
observed pass asks the criteria what to accumulate). Its names are imported on first use (the registry is read
without torch).
"""

from __future__ import annotations

from lightprune.core.lazy import lazy_package

_NAMES = {
    **{name: "lightprune.experts.criteria.registry" for name in (
        "CRITERIA", "register_criterion", "unregister_criterion", "get_criterion", "get_criterion_class",
        "available_criteria", "STATISTICS", "register_statistic", "available_statistics")},
    **{name: "lightprune.experts.criteria.scoring" for name in (
        "score_weights", "score_model_weights", "score_checkpoint", "weight_criterion")},
    "Criterion": "lightprune.experts.criteria.base",
    "CriterionNeedsDataError": "lightprune.experts.criteria.base",
    "CalibrationCriterion": "lightprune.experts.criteria.from_data",
    "FitCriterion": "lightprune.experts.criteria.from_data",
    "Statistic": "lightprune.experts.criteria.statistic",
    "AIMER": "lightprune.experts.criteria.aimer",
    "Magnitude": "lightprune.experts.criteria.magnitude",
    "RouterNorm": "lightprune.experts.criteria.router_norm",
    "RandomCriterion": "lightprune.experts.criteria.random",
    "MAEP": "lightprune.experts.criteria.maep",
    "RouterDeltaCriterion": "lightprune.experts.criteria.router_delta",
    **{name: "lightprune.experts.criteria.merge_methods" for name in ("MergeMethod", "HCSMoE", "MSMoE")},
}
__all__ = lazy_package(__name__, _NAMES)

"""Expert-importance criteria behind one registry (METHODS.md, "Calibration-free criteria").

Weight-only criteria score a model from its weights alone::

    imp = lp.score_weights(model, "aimer")          # also "magnitude", "router_norm", "random"
    plan = lp.select_experts(imp, ratio=0.5)

| name | raw value | pruned first | source |
|---|---|---|---|
| aimer | ||w||_1 / (sqrt(N) ||w||_2) | largest | paper 001, section 4.2, eq. (5) |
| magnitude | ||w||_2 (Frobenius) | smallest | paper 001, section 5 baselines |
| router_norm | ||W_r[e]||_2 | smallest | METHODS.md |
| random | U(0, 1), seeded | smallest | paper 001, section 5 baselines |

``w`` is one expert's flattened gate, up and down weights. Criteria that need data register in the same
registry (:mod:`.calibration`): ``frequency``, ``seer``, ``ean``, ``reap``, ``routing_kl``, ``delta_h``,
``delta_h_promoted`` and ``maep`` read the run's calibration statistics, ``router_delta`` an adapter fit's
scores; ``available_criteria(needs_data=True)`` lists them. The merging methods ``hc_smoe`` and ``m_smoe``
(:mod:`.merge_methods`) are named the same way and give a MergePlan instead of scores.

May import: models, experts (scores, calibration, maep) and the shared leaves.
"""

from __future__ import annotations

from lightprune.experts.criteria.aimer import AIMER
from lightprune.experts.criteria.base import Criterion, CriterionNeedsDataError
from lightprune.experts.criteria.calibration import MAEP, CalibrationCriterion, FitCriterion, RouterDeltaCriterion
from lightprune.experts.criteria.magnitude import Magnitude
from lightprune.experts.criteria.merge_methods import HCSMoE, MergeMethod, MSMoE
from lightprune.experts.criteria.random import RandomCriterion
from lightprune.experts.criteria.registry import (
    available_criteria,
    get_criterion,
    get_criterion_class,
    register_criterion,
    unregister_criterion,
)
from lightprune.experts.criteria.router_norm import RouterNorm
from lightprune.experts.criteria.scoring import score_checkpoint, score_weights, weight_criterion

__all__ = ["Criterion", "CriterionNeedsDataError", "register_criterion", "unregister_criterion", "get_criterion",
           "get_criterion_class", "available_criteria", "score_weights", "score_checkpoint", "weight_criterion", "AIMER",
           "Magnitude", "RouterNorm", "RandomCriterion", "CalibrationCriterion", "FitCriterion", "MAEP", "RouterDeltaCriterion", "MergeMethod",
           "HCSMoE", "MSMoE"]

"""The depth axis: whole routed experts scored, selected, masked, pruned (papers 001, 003, 004).

- :mod:`.plan` (:class:`ExpertPlan`, the only thing passed from scoring to surgery), :mod:`.scores`
  (:class:`ExpertScores`, higher = keep), :mod:`.select` (scores -> plan), :mod:`.mask` (reversible),
  :mod:`.prune` (structural);
- :mod:`.criteria`: every criterion behind one registry, weight criteria (AIMER, magnitude, router norm,
  random) and calibration criteria (frequency, SEER, EAN, REAP, routing KL, Delta-H, MAEP) alike;
- :mod:`.calibration`: the observed calibration pass and its statistics; :mod:`.maep`: MAEP's combination
  and closed-form alpha; :mod:`.sensitivity`: router-sensitivity scores of an adapter fit (paper 003);
  :mod:`.ranking`: rank statistics.

May import: models, observe and the shared leaves (batch, jsonio, distributed, errors, checks); never
width, finetune, export, callbacks or anything above.
"""

from __future__ import annotations

from lightprune.experts.calibration import CalibrationStats, collect_expert_stats
from lightprune.experts.criteria import Criterion, available_criteria, get_criterion, register_criterion, score_weights
from lightprune.experts.maep import maep_scores
from lightprune.experts.mask import is_masked, mask_experts
from lightprune.experts.plan import ExpertPlan
from lightprune.experts.prune import prune_experts, resize_experts
from lightprune.experts.scores import ExpertScores
from lightprune.experts.select import select_experts

__all__ = ["CalibrationStats", "Criterion", "ExpertPlan", "ExpertScores", "available_criteria",
           "collect_expert_stats", "get_criterion", "is_masked", "maep_scores", "mask_experts", "prune_experts",
           "register_criterion", "resize_experts", "score_weights", "select_experts"]

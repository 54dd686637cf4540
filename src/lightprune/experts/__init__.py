"""The depth axis: whole routed experts scored, selected, masked, pruned.

The methods: MAEP ("Modality-Aware Expert Pruning for MoE-Based Multimodal Large Language Models", arXiv
2611.05927), AIMER ("AIMER: Calibration-Free Task-Agnostic MoE Pruning", arXiv 2603.18492) and router sensitivity
("Router Sensitivity Under Lightweight Fine-Tuning Identifies Prunable Experts in Mixture-of-Experts Models",
arXiv 2608.07890).

- [`plan`][.plan] ([`ExpertPlan`][.plan.ExpertPlan], the only thing passed from scoring to surgery), [`scores`][.scores]
  ([`ExpertScores`][.scores.ExpertScores], higher = keep), [`select`][.select] (scores -> plan), [`mask`][.mask]
  (reversible), [`prune`][.prune] (structural);
- `criteria`: every criterion behind one registry, weight criteria (AIMER, magnitude, router norm,
  random) and calibration criteria (frequency, SEER, EAN, REAP, routing KL, Delta-H, MAEP) alike;
- `calibration`: the observed calibration pass and its statistics; [`maep`][.maep]: MAEP's combination
  and closed-form alpha; [`sensitivity`][.sensitivity]: router-sensitivity scores of an adapter fit;
  `ranking`: rank statistics.

May import: models, observe and the shared leaves (batch, jsonio, distributed, errors, checks); never
width, finetune, export, callbacks or anything above. Its names are imported on first use.
"""

from __future__ import annotations

from lightprune.core.lazy import lazy_package

_NAMES = {
    "CalibrationStats": "lightprune.experts.calibration",
    "collect_expert_stats": "lightprune.experts.calibration",
    "Criterion": "lightprune.experts.criteria",
    "available_criteria": "lightprune.experts.criteria",
    "get_criterion": "lightprune.experts.criteria",
    "register_criterion": "lightprune.experts.criteria",
    "score_weights": "lightprune.experts.criteria",
    "maep_scores": "lightprune.experts.maep",
    "is_masked": "lightprune.experts.mask",
    "mask_experts": "lightprune.experts.mask",
    "ExpertPlan": "lightprune.experts.plan",
    "prune_experts": "lightprune.experts.prune",
    "resize_experts": "lightprune.experts.prune",
    "ExpertScores": "lightprune.experts.scores",
    "select_experts": "lightprune.experts.select",
}
__all__ = lazy_package(__name__, _NAMES)

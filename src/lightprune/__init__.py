"""lightprune: fine-tune, score, prune and export Mixture-of-Experts LLMs and MLLMs.

The public API (see docs/python-api.md)::

    layers = lp.find_moe_layers(model)
    imp = lp.score_weights(model, "aimer")
    plan = lp.select_experts(imp, ratio=0.5, allocation="global")
    with lp.mask_experts(model, plan): ...
    lp.prune_experts(model, plan)
    lp.save_pruned(model, out_dir); model = lp.load_pruned(out_dir)

    # expert merging (HC-SMoE, M-SMoE): statistics from the same calibration pass
    stats = lp.collect_expert_stats(model, batches, criteria=["frequency", "expert_outputs", "router_logits"])
    mplan = lp.hc_smoe_plan(stats, ratio=0.5)       # or lp.m_smoe_plan(stats, 0.5, align=True)
    with lp.merged_experts(model, mplan): ...         # reversible
    lp.export_pruned(model, mplan, out_dir)           # merge + save + reload + verify

    # MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"): width pruning of MLLMs
    scores = lp.taylor_importance(model, batches, attention=True)
    wplan = lp.select_paths(scores.attn, {"v2v": 0.4}, lp.WidthPlan.dense(model))
    with lp.mask_width(model, wplan): ...
    lp.decoder_flops(model.config, vision_tokens, text_tokens, plan=wplan).fraction
    lp.save_width_pruned(model, wplan, out_dir)   # load_pruned swaps the path-sparse kernels in

    # a whole recipe in one call (what `lightprune COMMAND --config ...` runs); returns the run directory
    run_dir = lp.run_recipe("configs/reap_testbed.yaml", overrides={"prune.ratio": 0.25})

Heavy modules (transformers, lightning, export) are imported on first use.
"""

from __future__ import annotations

from lightprune import _starting  # noqa: F401  (first: the console script's signals in its first moments)

from typing import Any

from lightprune.core.lazy import lazy_attributes
from lightprune.core.notices import install_filters as _install_filters, verbose as _verbose

if not _verbose():  # the Python API as quiet as the command (lightprune.core.notices); LIGHTPRUNE_VERBOSE=1 keeps all
    _install_filters()

__version__ = "0.1.0"

_LAZY = {
    "run_recipe": "lightprune.cli.recipe",
    "find_moe_layers": "lightprune.models",
    "get_family": "lightprune.models",
    "register_family": "lightprune.models",
    "supported_model_types": "lightprune.models",
    "MoELayer": "lightprune.models",
    "base_model_of": "lightprune.models.unwrap",
    "ExpertPlan": "lightprune.experts.plan",
    "PlanError": "lightprune.core.errors",
    "ExpertScores": "lightprune.experts.scores",
    "select_experts": "lightprune.experts.select",
    "maep_scores": "lightprune.experts.maep",
    "mask_experts": "lightprune.experts.mask",
    "prune_experts": "lightprune.experts.prune",
    "MergePlan": "lightprune.experts.merging",
    "merge_experts": "lightprune.experts.merging",
    "merged_experts": "lightprune.experts.merging",
    "hc_smoe_plan": "lightprune.experts.merging",
    "m_smoe_plan": "lightprune.experts.merging",
    "Criterion": "lightprune.experts.criteria",
    "score_weights": "lightprune.experts.criteria",
    "prune_checkpoint": "lightprune.export",
    "quantize_checkpoint": "lightprune.export",
    "register_criterion": "lightprune.experts.criteria",
    "get_criterion": "lightprune.experts.criteria",
    "available_criteria": "lightprune.experts.criteria",
    "collect_expert_stats": "lightprune.experts.calibration",
    "CalibrationStats": "lightprune.experts.calibration",
    "router_row_norms": "lightprune.experts.sensitivity",
    "weight_delta": "lightprune.experts.sensitivity",
    "router_logits": "lightprune.experts.sensitivity",
    "logit_delta": "lightprune.experts.sensitivity",
    "AdapterSpec": "lightprune.finetune.adapters",
    "apply_adapter": "lightprune.finetune.adapters",
    "remove_adapters": "lightprune.finetune.adapters",
    "save_pruned": "lightprune.export",
    "load_pruned": "lightprune.export",
    "export_pruned": "lightprune.export",
    "ExportVerificationError": "lightprune.export",
    "ExportResult": "lightprune.export",
    "WidthExportResult": "lightprune.export",
    "WidthPlan": "lightprune.width.plan",
    "mask_width": "lightprune.width.mask",
    "taylor_importance": "lightprune.width.taylor",
    "WidthScores": "lightprune.width.taylor",
    "find_width_layers": "lightprune.width.layers",
    "token_modality": "lightprune.width.modality",
    "select_paths": "lightprune.width.select",
    "select_channels": "lightprune.width.select",
    "decoder_flops": "lightprune.width.flops",
    "WidthScorer": "lightprune.width.scorer",
    "register_width_scorer": "lightprune.width.scorers",
    "get_width_scorer": "lightprune.width.scorers",
    "available_width_scorers": "lightprune.width.scorers",
    "save_width_pruned": "lightprune.export",
    "path_sparse_attention": "lightprune.width.kernels",
}
__all__ = sorted(_LAZY) + ["__version__"]


_lazy_getattr, _ = lazy_attributes(__name__, _LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return _lazy_getattr(name)
    raise AttributeError(f"module 'lightprune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__

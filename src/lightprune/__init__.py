"""lightprune: fine-tune, score, prune and export Mixture-of-Experts LLMs and MLLMs.

The public API (names and signatures are stable; see DESIGN.md)::

    layers = lp.find_moe_layers(model)
    imp = lp.score_weights(model, "aimer")
    plan = lp.select_experts(imp, ratio=0.5, allocation="global")
    with lp.mask_experts(model, plan): ...
    lp.prune_experts(model, plan)
    lp.save_pruned(model, out_dir); model = lp.load_pruned(out_dir)

    # MWOP: width pruning of MLLMs (paper 002)
    scores = lp.taylor_importance(model, batches, attention=True)
    wplan = lp.select_paths(scores.attn, {"v2v": 0.4}, lp.WidthPlan.dense(model))
    with lp.mask_width(model, wplan): ...
    lp.decoder_flops(model.config, vision_tokens, text_tokens, plan=wplan).fraction
    lp.save_width_pruned(model, wplan, out_dir)   # load_pruned swaps the path-sparse kernels in

Heavy modules (transformers, lightning, export) are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "find_moe_layers": "lightprune.models",
    "get_adapter": "lightprune.models",
    "MoELayer": "lightprune.models",
    "ExpertPlan": "lightprune.plan",
    "PlanError": "lightprune.plan",
    "ExpertScores": "lightprune.scores",
    "select_experts": "lightprune.select",
    "maep_scores": "lightprune.maep",
    "mask_experts": "lightprune.surgery",
    "prune_experts": "lightprune.surgery",
    "score_weights": "lightprune.criteria",
    "register_criterion": "lightprune.criteria",
    "get_criterion": "lightprune.criteria",
    "available_criteria": "lightprune.criteria",
    "collect_expert_stats": "lightprune.calibration",
    "CalibrationStats": "lightprune.calibration",
    "router_row_norms": "lightprune.sensitivity",
    "weight_delta": "lightprune.sensitivity",
    "router_logits": "lightprune.sensitivity",
    "logit_delta": "lightprune.sensitivity",
    "AdapterSpec": "lightprune.modules",
    "apply_adapter": "lightprune.modules",
    "remove_adapters": "lightprune.modules",
    "save_pruned": "lightprune.export",
    "load_pruned": "lightprune.export",
    "export_pruned": "lightprune.export",
    "ExportVerificationError": "lightprune.export",
    "WidthPlan": "lightprune.plan",
    "mask_width": "lightprune.surgery",
    "taylor_importance": "lightprune.taylor",
    "WidthScores": "lightprune.taylor",
    "find_width_layers": "lightprune.models.width",
    "token_modality": "lightprune.models.width",
    "select_paths": "lightprune.width_select",
    "select_channels": "lightprune.width_select",
    "decoder_flops": "lightprune.flops",
    "save_width_pruned": "lightprune.export",
    "path_sparse_attention": "lightprune.kernels",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lightprune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__

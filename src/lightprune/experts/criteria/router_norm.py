"""Router norm: the L2 norm of an expert's router row (calibration-free baseline).

A baseline of lightprune's own, beside the weight-only criteria of AIMER ("AIMER: Calibration-Free Task-Agnostic
MoE Pruning", arXiv 2603.18492): with ``W_r`` in R^{E x H} the router projection of AIMER section 3 (z = W_r h),
expert ``e`` scores

    router_norm(e) = ||W_r[e, :]||_2.

Experts with the **smallest** router norm are pruned first, so importance = raw. Only the
router weight counts (no bias, no DeepSeek-V3 ``e_score_correction_bias``); the row is reduced
in float64.
"""

from __future__ import annotations

import torch

from lightprune.experts.criteria.base import Criterion
from lightprune.experts.criteria.registry import register_criterion
from lightprune.models import MoELayer

__all__ = ["RouterNorm"]


@register_criterion("router_norm")
class RouterNorm(Criterion):
    """L2 norm of the expert's router row; smallest pruned first."""

    def weight_modules(self, layer: MoELayer) -> list[torch.nn.Module]:
        return [layer.router_linear]

    def score_layer(self, layer: MoELayer) -> torch.Tensor:
        weight = layer.router_linear.weight
        if weight.dim() != 2 or weight.shape[0] != layer.num_selectable:
            raise ValueError(f"layer {layer.index} ({layer.name}): router weight has shape {tuple(weight.shape)}; "
                             f"expected [{layer.num_selectable}, hidden]")
        # the experts' rows (any identity experts' rows follow them and are not scored)
        return torch.linalg.vector_norm(weight[:layer.num_experts].double(), 2, dim=1)

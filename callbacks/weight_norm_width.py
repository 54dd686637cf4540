"""A project-local width scorer: head and FFN-channel importance from the output weights' norms (no data).

A worked example of extending lightprune's width axis (MWOP, paper 002, section 3: every head's three attention
paths and every FFN channel's vision and text executions are the units). For decoder layer l with output
projection W_o [d, H * d_h] (head h owns the columns h d_h .. (h + 1) d_h - 1) and down projection W_down [d, m]:

    head h     ||W_o[:, h d_h : (h + 1) d_h]||_F    (one value for the V2V, T2V and T2T paths)
    channel c  ||W_down[:, c]||_2                   (one value for the vision and text executions)

the smallest pruned first. The decorator registers the class, so a config names it by class path
(``criterion: {class_path: callbacks.weight_norm_width.WeightNormWidth}`` under ``WidthSearch``) or, once this
module is imported, as ``criterion: weight_norm_width``.
"""

from __future__ import annotations

import torch

from lightprune.width.layers import WidthLayer
from lightprune.width.scorer import WidthScorer
from lightprune.width.scorers import register_width_scorer

__all__ = ["WeightNormWidth"]


@register_width_scorer("weight_norm_width")
class WeightNormWidth(WidthScorer):
    """Head h: Frobenius norm of o_proj's column block; channel c: L2 norm of down_proj's column c."""

    def score_heads(self, layer: WidthLayer) -> torch.Tensor:
        weight = layer.attention.o_proj.weight.double()  # [hidden, heads * head_dim]
        return torch.linalg.vector_norm(weight.view(weight.shape[0], layer.num_heads, layer.head_dim), dim=(0, 2))

    def score_channels(self, layer: WidthLayer) -> torch.Tensor:
        return torch.linalg.vector_norm(layer.down_proj.weight.double(), dim=0)  # [intermediate_size]

"""Magnitude: the Frobenius norm of an expert's weights (a calibration-free baseline of AIMER).

AIMER (Liu et al., "AIMER: Calibration-Free Task-Agnostic MoE Pruning", arXiv 2603.18492), section 5 (baselines)
and the Magnitude-versus-AIMER discussion: with ``w`` the expert's flattened gate, up and down projection weights
(biases excluded, as for AIMER),

    magnitude(w) = ||w||_2 = sqrt(||W_gate||_F^2 + ||W_up||_F^2 + ||W_down||_F^2).

Experts with the **smallest** magnitude are pruned first, so importance = raw.
"""

from __future__ import annotations

import torch

from lightprune.experts.criteria.base import Criterion
from lightprune.experts.criteria.registry import register_criterion
from lightprune.experts.criteria.weights import expert_weight_norms
from lightprune.models import MoELayer

__all__ = ["Magnitude"]


@register_criterion("magnitude")
class Magnitude(Criterion):
    """Frobenius norm of the expert's gate, up and down weights; smallest pruned first."""

    def __init__(self, block_elements: int | None = None):
        self.block_elements = None if block_elements is None else self._check_int("block_elements", block_elements, 1)

    def weight_modules(self, layer: MoELayer) -> list[torch.nn.Module]:
        return [layer.experts]

    def score_layer(self, layer: MoELayer) -> torch.Tensor:
        _, sq, _ = expert_weight_norms(layer, l1=False, block_elements=self.block_elements)
        return sq.sqrt()

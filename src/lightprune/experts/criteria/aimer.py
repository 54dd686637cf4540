"""AIMER: Absolute mean over root mean square IMportance for Expert Ranking.

AIMER (Liu et al., "AIMER: Calibration-Free Task-Agnostic MoE Pruning", arXiv 2603.18492), section 4.2, eqs.
(3)-(5) and Algorithm 1. Flatten and concatenate one expert's gate, up and down projection weights into ``w`` in
R^N; then

    AIMER(w) = ||w||_1 / (sqrt(N) ||w||_2) = (P / N) / sqrt(Q / N),

with P the sum of the three l1 norms and Q the sum of the three squared Frobenius norms. The
value lies in [1/sqrt(N), 1] (eq. 7): 1 when all entries have equal magnitude, 1/sqrt(N) when
one entry is non-zero. It is scale-invariant. Experts with **larger** AIMER are pruned first
(section 4.2), the same fraction in every layer (section 4.1, i.e. ``allocation="uniform"``),
so ``raw`` is AIMER and importance is ``-AIMER``.

Weights only, as in the paper: the expert's slices of the fused ``gate_up_proj [E, 2I, H]``
(or ``gate_proj``/``up_proj``) and ``down_proj [E, H, I]``; biases and the router are not part
of ``w``. An all-zero expert (P = Q = 0, AIMER undefined) gets AIMER = 1, the upper bound, so it
is pruned first: it computes nothing. An expert with a NaN or infinite weight is an error (a broken
checkpoint), never the score of an all-zero expert. Values are clamped to the bounds of eq. (7), which only
removes float rounding (an expert of equal magnitudes would otherwise read 1 + 1e-7).
"""

from __future__ import annotations

import math

import torch

from lightprune.experts.criteria.base import Criterion
from lightprune.experts.criteria.registry import register_criterion
from lightprune.experts.criteria.weights import expert_weight_norms
from lightprune.models import MoELayer

__all__ = ["AIMER"]


@register_criterion("aimer")
class AIMER(Criterion):
    """AIMER = ||w||_1 / (sqrt(N) ||w||_2) per expert; larger is pruned first.

    ``block_elements`` sets how many weight elements are reduced at once (a speed knob; the
    default suits the device; it does not change the result beyond float rounding).
    """

    def __init__(self, block_elements: int | None = None):
        self.block_elements = None if block_elements is None else self._check_int("block_elements", block_elements, 1)

    def weight_modules(self, layer: MoELayer) -> list[torch.nn.Module]:
        return [layer.experts]

    def score_layer(self, layer: MoELayer) -> torch.Tensor:
        l1, sq, numel = expert_weight_norms(layer, block_elements=self.block_elements)
        value = (l1 / (math.sqrt(numel) * sq.sqrt())).clamp_(1.0 / math.sqrt(numel), 1.0)
        # all-zero expert -> 1; a NaN / inf weight stays non-finite (Criterion.score refuses it, naming the experts)
        return torch.where((sq > 0) | ~torch.isfinite(sq) | ~torch.isfinite(l1), value, torch.ones_like(value))

    def importance(self, raw: torch.Tensor) -> torch.Tensor:
        return -raw

"""Random: seeded uniform scores, the sanity baseline of AIMER ("AIMER: Calibration-Free Task-Agnostic MoE
Pruning", arXiv 2603.18492), section 5, "Random".

Each expert of layer ``l`` scores an independent U(0, 1) draw from a ``torch.Generator``
seeded with a 64-bit mix (splitmix64) of ``(seed, l)``: the same seed gives the same scores,
different layers get different draws, and a layer's draw does not depend on the other layers
(dense layers, other layers' expert counts). Smallest pruned first; importance = raw.
"""

from __future__ import annotations

import torch

from lightprune.experts.criteria.base import Criterion
from lightprune.experts.criteria.registry import register_criterion
from lightprune.models import MoELayer

__all__ = ["RandomCriterion", "layer_seed"]

_MASK = (1 << 64) - 1


def layer_seed(seed: int, layer_index: int) -> int:
    """A well-mixed 64-bit seed for ``(seed, layer_index)`` (splitmix64 finaliser)."""
    z = (seed * 0x9E3779B97F4A7C15 + layer_index + 1) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


@register_criterion("random")
class RandomCriterion(Criterion):
    """Seeded uniform random scores; reproducible per (seed, layer)."""

    reads_weights = False

    def __init__(self, seed: int = 0):
        self.seed = self._check_int("seed", seed, minimum=0)

    def score_layer(self, layer: MoELayer) -> torch.Tensor:
        generator = torch.Generator(device="cpu").manual_seed(layer_seed(self.seed, layer.index))
        return torch.rand(layer.num_experts, generator=generator, dtype=torch.float64)

"""ExpertScores: per-layer expert importance (higher = keep) with what selection needs.

A plain ``{layer index: tensor[E_l]}`` mapping that also carries each layer's routing limits
(for the floor), the criterion's name and, where the paper's value differs from the importance
(AIMER prunes its largest values), the raw values for reports.
"""

from __future__ import annotations

from typing import Mapping

import torch

from lightprune.core.errors import listed
from lightprune.models.base import MoELayer, RoutingLimits

__all__ = ["ExpertScores"]


class ExpertScores(dict):
    """``{layer_index: tensor[E_l]}`` importance, plus ``limits``, ``criterion`` and ``raw``."""

    def __init__(self, importance: Mapping[int, torch.Tensor], limits: Mapping[int, RoutingLimits],
                 criterion: str = "unknown", raw: Mapping[int, torch.Tensor] | None = None):
        super().__init__({int(k): v for k, v in sorted(importance.items())})
        missing = sorted(set(self) - set(limits))
        if missing:
            raise ValueError(f"no routing limits given for layers {listed(missing)}")
        for layer, values in self.items():
            if values.dim() != 1 or values.numel() != limits[layer].num_experts:
                raise ValueError(f"layer {layer}: expected {limits[layer].num_experts} scores, "
                                 f"got shape {tuple(values.shape)}")
        self.limits = {int(k): v for k, v in limits.items()}
        self.criterion = criterion
        self.raw = dict(raw) if raw is not None else dict(self)

    @staticmethod
    def limits_of(layers: list[MoELayer]) -> dict[int, RoutingLimits]:
        return {layer.index: layer.limits for layer in layers}

    def to_json(self) -> dict:
        """``{"criterion", "importance": {layer: [...]}, "raw": {layer: [...]}}`` for scores.json."""
        def plain(d):
            return {str(k): [float(x) for x in v.detach().double().cpu().tolist()] for k, v in d.items()}
        return {"criterion": self.criterion, "importance": plain(self), "raw": plain(self.raw)}

"""ExpertScores: per-layer expert importance (higher = keep) with what selection needs.

A plain ``{layer index: tensor[E_l]}`` mapping that also carries each layer's routing limits
(for the floor), the criterion's name and, where the paper's value differs from the importance
(AIMER prunes its largest values), the raw values for reports.

Scores are real numbers to rank: a floating-point or integer tensor (an integer count ranks as well as a float). A
bool tensor (its experts would be ranked by how ties are broken), a complex one (no order: its imaginary parts would be
dropped) or one on the meta device (no values) is refused naming the layer, here and wherever
[`select_experts`][..select.select_experts] takes scores (`check_score_values`).
"""

from __future__ import annotations

from typing import Mapping

import torch

from lightprune.core.errors import listed
from lightprune.models.layer import MoELayer, RoutingLimits

__all__ = ["ExpertScores"]


def check_score_values(layer: int, values: torch.Tensor) -> None:
    """Refuse the scores of ``layer`` when they are not real numbers that can be ranked: a bool or complex dtype, or
    a tensor on the meta device; one line naming the layer, what they are and what to give instead."""
    dtype = values.dtype
    if dtype == torch.bool:
        why = "True and False only, so which experts go would be decided by how ties are broken"
    elif dtype.is_complex:
        why = "complex numbers have no order, and their imaginary parts would be dropped"
    elif values.is_meta:
        raise ValueError(f"layer {layer}: scores on the meta device hold no values to rank; compute them on a device "
                         "with data (cpu, cuda)")
    else:
        return
    raise ValueError(f"layer {layer}: scores of dtype {dtype} cannot be ranked ({why}); give the importance as a "
                     "floating-point or integer tensor (higher = keep)")


class ExpertScores(dict):
    """``{layer_index: tensor[E_l]}`` importance, plus ``limits``, ``criterion`` and ``raw``."""

    def __init__(self, importance: Mapping[int, torch.Tensor], limits: Mapping[int, RoutingLimits],
                 criterion: str = "unknown", raw: Mapping[int, torch.Tensor] | None = None):
        super().__init__({int(k): v for k, v in sorted(importance.items())})
        missing = sorted(set(self) - set(limits))
        if missing:
            raise ValueError(f"no routing limits given for layers {listed(missing)}")
        for layer, values in self.items():
            check_score_values(layer, values)
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

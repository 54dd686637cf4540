"""A project-local criterion: importance = Frobenius norm of each expert's down projection.

A worked example of extending lightprune. The decorator registers the class under a name, so a
config can name it either by class path (as configs/custom_criterion.yaml does) or, once this
module is imported, as ``criterion: down_proj_norm``.
"""

from __future__ import annotations

import torch

from lightprune.experts.criteria import Criterion, register_criterion
from lightprune.experts.scores import ExpertScores
from lightprune.models import find_moe_layers

__all__ = ["DownProjNorm"]


@register_criterion("down_proj_norm")
class DownProjNorm(Criterion):
    """||down_proj[e]||_F for every routed expert e; the smallest are pruned first."""

    @torch.no_grad()
    def score(self, model: torch.nn.Module) -> ExpertScores:
        layers = find_moe_layers(model)
        values = {layer.index: torch.linalg.vector_norm(layer.experts.down_proj.float(), dim=(1, 2))
                  for layer in layers}
        return ExpertScores(values, ExpertScores.limits_of(layers), criterion=self.name)

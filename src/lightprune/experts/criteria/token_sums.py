"""Frequency, SEER, EAN and REAP: four criteria read off the same token-level sums over each subset's routed tokens
(AIMER ("AIMER: Calibration-Free Task-Agnostic MoE Pruning", arXiv 2603.18492), appendix B; the routing weights as
in MAEP ("Modality-Aware Expert Pruning for MoE-Based Multimodal Large Language Models", arXiv 2611.05927),
section 3).

For expert j of a layer and the tokens t of a subset that the router sent to j, with g_j(t) the weight the expert's
output gets in the block and f_j(t) its unweighted output:

- ``frequency``: n_j, the tokens routed to j;
- ``seer``: sum_t g_j(t);
- ``ean``: sum_t ||f_j(t)||;
- ``reap``: (1 / n_j) sum_t g_j(t) ||f_j(t)|| (0 when n_j = 0): REAP's numerator is summed here, divided by the
  frequency when the value is read.

Higher is kept for all four (importance = the value). The four per-slot quantities of a batch (1, g, ||f||,
g ||f||) are scattered into their experts in one call per batch, in the compute dtype, and added to float64 sums
[U, E].
"""

from __future__ import annotations

import torch

from lightprune.experts.criteria.from_data import CalibrationCriterion
from lightprune.experts.criteria.registry import register_criterion
from lightprune.experts.criteria.statistic import Statistic, SubsetCounts
from lightprune.models import MoELayer

__all__ = ["TokenSums", "STATISTIC", "Frequency", "Seer", "Ean", "Reap"]

#: the sums, in the order of the per-slot quantities 1, g, ||f||, g ||f||
_SUMS = ("frequency", "seer", "ean", "reap_num")


class TokenSums(Statistic):
    """Frequency, SEER, EAN and REAP's numerator per expert and subset (see the module docstring)."""

    values = ("frequency", "seer", "ean", "reap")

    def __init__(self, layer: MoELayer, subsets: tuple[str, ...], wanted: tuple[str, ...],
                 counts: SubsetCounts | None = None):
        super().__init__(layer, subsets, wanted, counts)
        self.sums = {name: self.zeros(len(subsets), layer.num_experts) for name in _SUMS}

    def update(self, batch) -> None:
        m, w = batch.m, batch.w
        per_slot = torch.stack([torch.ones_like(w), w, batch.norms, w * batch.norms], dim=1)   # [T, 4, k]
        # each subset's token-weighted slot values, added at their experts: [U, 4, T k] -> [U, 4, E]
        weighted = (m.view(m.shape[0], -1, 1, 1) * per_slot).transpose(1, 2).flatten(2)
        sums = torch.zeros(m.shape[0], len(_SUMS), self.num_selectable, dtype=batch.dtype, device=batch.hidden.device)
        sums.scatter_add_(2, batch.selected.reshape(1, 1, -1).expand(m.shape[0], len(_SUMS), -1), weighted)
        for row, name in enumerate(_SUMS):  # the experts' columns (identity experts' dropped)
            self.sums[name] += sums[:, row, :self.num_experts].double()

    def value(self, name: str, subset: int | None) -> torch.Tensor:
        if name == "reap":
            freq = self.sums["frequency"][subset]
            return torch.where(freq > 0, self.sums["reap_num"][subset] / freq.clamp_min(1), torch.zeros_like(freq))
        return self.sums[name][subset]


#: what the observed pass accumulates for these criteria
STATISTIC = TokenSums


@register_criterion("frequency")
class Frequency(CalibrationCriterion):
    """n_j: the subset's tokens routed to expert j."""

    statistic = "frequency"


@register_criterion("seer")
class Seer(CalibrationCriterion):
    """SEER: sum of the routing weight g_j(t) over the subset's tokens routed to j."""

    statistic = "seer"


@register_criterion("ean")
class Ean(CalibrationCriterion):
    """EAN: sum of the output norm ||f_j(t)|| over the subset's tokens routed to j."""

    statistic = "ean"


@register_criterion("reap")
class Reap(CalibrationCriterion):
    """REAP: (1 / n_j) sum g_j(t) ||f_j(t)|| over the subset's tokens routed to j, the mean router-weighted output
    norm (0 when n_j = 0)."""

    statistic = "reap"

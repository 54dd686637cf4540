"""Expert merging methods in the criteria registry: ``hc_smoe`` and ``m_smoe`` (MAEP's merging baselines), and the
statistics they cluster by, summed over calibration tokens in the observed pass.

A `MergeMethod` is named and configured like a calibration criterion (``ExpertPruning(criterion="hc_smoe",
ratio=0.5)``, ``get_criterion("m_smoe", align=False)``) but produces a [`MergePlan`][...merging.plan.MergePlan]
from the run's calibration statistics instead of scores: `MergeMethod.merge_plan`. Its statistics come from
the observed calibration pass (``ExpertStats(criteria=[..., "expert_outputs"])`` for HC-SMoE, ``"router_logits"``
for M-SMoE: `MergeMethod.statistic`). The methods themselves:
[`lightprune.experts.merging.methods`][...merging.methods].

- ``expert_outputs`` (HC-SMoE, Chen et al. 2025, section 3.1): every routed expert's unweighted output on every
  calibration token, whether the router picked it or not, summed per expert: ``[E, H]``; divided by the token
  count it is the expert's mean output, the vector HC-SMoE clusters experts by;
- ``router_logits`` (M-SMoE, Li et al. 2024, section 3.1): the Gram matrix of the router logits over tokens,
  sum_t l_t l_t^T ``[E, E]``; the cosine of experts i and j over the calibration tokens is
  G_ij / sqrt(G_ii G_jj).

Tokens are those of the collected subsets (padding excluded). Nothing per token is kept across batches: each
layer-batch adds its sums, computed in float32 on the model's device (all experts on a chunk of tokens at a
time, in one grouped matmul per projection), to float64 sums held on the CPU (reduced across ranks on the backend's
device).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from lightprune.core.extras import require
from lightprune.experts.criteria.base import Criterion
from lightprune.experts.criteria.registry import register_criterion
from lightprune.experts.criteria.statistic import Statistic, SubsetCounts
from lightprune.experts.merging.methods import hc_smoe_plan, m_smoe_plan
from lightprune.experts.merging.plan import ROUTER_RULES, MergePlan
from lightprune.models import MoELayer
from lightprune.observe.experts_impl import expert_rows

__all__ = ["MergeSums", "STATISTIC", "dense_output_sum", "MergeMethod", "HCSMoE", "MSMoE"]

#: elements of the dense outputs computed at once (tokens x experts x width)
_CHUNK_ELEMENTS = 1 << 22


class MergeSums(Statistic):
    """Sums of ``expert_outputs`` and ``router_logits`` (those ``wanted``) for one MoE layer, over every token of the
    collected subsets; the value is the sum divided by the token count (one value per layer, not per subset)."""

    values = ("expert_outputs", "router_logits")
    per_subset = False
    requires = ("frequency",)  # the merges weight each member by its routing frequency
    state_group = "merging"

    def __init__(self, layer: MoELayer, subsets: tuple[str, ...], wanted: tuple[str, ...],
                 counts: SubsetCounts | None = None):
        super().__init__(layer, subsets, wanted, counts)
        self.sums = {"tokens": self.zeros()}
        if "expert_outputs" in wanted:
            width = layer.family.expert_output_width(layer)
            self.sums["expert_outputs"] = self.zeros(layer.num_experts, width)
        if "router_logits" in wanted:
            self.sums["router_logits"] = self.zeros(layer.num_experts, layer.num_experts)

    @torch.no_grad()
    def update(self, batch) -> None:
        """Every token in some subset, weighted 1 (padding 0: its rows are computed and weigh nothing, so the host
        never reads how many there are)."""
        layer, keep = batch.layer, batch.keep
        self.sums["tokens"] += keep.sum().to(self.sums["tokens"])
        if "expert_outputs" in self.sums:
            self.sums["expert_outputs"] += dense_output_sum(layer, batch.hidden, keep).double().to(self.device)
        if "router_logits" in self.sums:
            logits = layer.family.router_logits(layer, batch.router_input)[:, :layer.num_experts].float()
            logits = torch.where(keep.unsqueeze(-1), logits, logits.new_zeros(()))
            self.sums["router_logits"] += (logits.T @ logits).double().to(self.device)

    def value(self, name: str, subset: int | None = None) -> torch.Tensor:
        """The per-token mean (float64, CPU)."""
        return self.sums[name].cpu() / max(float(self.sums["tokens"]), 1.0)

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        for name, t in self.sums.items():
            if name not in state or state[name].shape != t.shape:
                raise ValueError(f"layer {self.index}: calibration state has no merging statistic {name!r} of "
                                 f"shape {tuple(t.shape)}")
            t.copy_(state[name])


def dense_output_sum(layer: MoELayer, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """sum_t f_e(x_t) for every routed expert e: ``[E, H]`` in float32 (or wider), ``x`` [n, H_in]; ``weight``
    [n] bool: only the tokens it marks (the others computed and not added)."""
    num = layer.num_experts
    width = max(x.shape[-1], layer.family.expert_output_width(layer))
    step = max(1, _CHUNK_ELEMENTS // (num * width))
    dtype = torch.promote_types(x.dtype, torch.float32)
    total = torch.zeros(num, layer.family.expert_output_width(layer), dtype=dtype, device=x.device)
    ids = torch.arange(num, device=x.device)
    for start in range(0, x.shape[0], step):
        chunk = x[start:start + step]
        n = chunk.shape[0]
        tokens = torch.arange(n, device=x.device).repeat(num)
        # expert-major: [E * n, H]
        out = layer.family.selected_rows(layer, chunk, tokens, ids.repeat_interleave(n), expert_rows)
        out = out.view(num, n, -1).to(dtype)
        if weight is not None:
            out = torch.where(weight[start:start + step].view(1, n, 1), out, out.new_zeros(()))
        total += out.sum(dim=1)
    return total


#: what the observed pass accumulates for the merging methods
STATISTIC = MergeSums


class MergeMethod(Criterion):
    """Base class of the merging methods: `merge_plan` from calibration statistics."""

    needs_data: ClassVar[bool] = True
    #: the merging statistic the calibration pass must collect
    statistic: ClassVar[str] = ""

    def __init__(self, router: str = "dominant", subset: str = "all"):
        if router not in ROUTER_RULES:
            raise ValueError(f"router must be one of {list(ROUTER_RULES)}, got {router!r}")
        self.router, self.subset = router, subset

    def merge_plan(self, calibration: Any, ratio: float, allocation: str = "uniform") -> MergePlan:
        """The MergePlan at ``ratio`` from the run's CalibrationStats (an error naming what to collect without)."""
        if calibration is None:
            raise ValueError(f"merging method {self.name!r} needs calibration statistics with {self.statistic!r}: "
                             f"add ExpertStats(criteria=[..., {self.statistic!r}]) and run `lightprune calibrate`")
        return self._plan(calibration, ratio, allocation)

    def _plan(self, calibration: Any, ratio: float, allocation: str) -> MergePlan:
        raise NotImplementedError

    def score_in_run(self, model: nn.Module, calibration: Any = None, fitted: Any = None):
        raise TypeError(f"{self.name!r} merges experts and gives no scores: ask it for merge_plan(stats, ratio)")


@register_criterion("hc_smoe")
class HCSMoE(MergeMethod):
    """HC-SMoE: average-linkage clustering of the experts' mean outputs, frequency-weighted merge (uniform per
    layer, the paper's configuration)."""

    statistic: ClassVar[str] = "expert_outputs"

    def _plan(self, calibration: Any, ratio: float, allocation: str) -> MergePlan:
        if allocation != "uniform":
            raise ValueError(f"hc_smoe clusters every layer into the same share of its experts: allocation must be "
                             f"'uniform', got {allocation!r}")
        return hc_smoe_plan(calibration, ratio, router=self.router, subset=self.subset)


@register_criterion("m_smoe")
class MSMoE(MergeMethod):
    """M-SMoE: frequent experts dominate, the others join the dominant with the most similar router logits,
    neuron-aligned (``align``) frequency-weighted merge."""

    statistic: ClassVar[str] = "router_logits"

    def __init__(self, align: bool = True, router: str = "dominant", subset: str = "all"):
        super().__init__(router, subset)
        if not isinstance(align, bool):
            raise ValueError(f"align must be true or false, got {align!r}")
        if align:  # at construction, not after the calibration pass that precedes the merge
            require("merging", "M-SMoE's neuron alignment (align: true)")
        self.align = align

    def _plan(self, calibration: Any, ratio: float, allocation: str) -> MergePlan:
        return m_smoe_plan(calibration, ratio, allocation=allocation, align=self.align, router=self.router,
                           subset=self.subset)

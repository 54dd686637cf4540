"""Expert merging methods in the criteria registry: ``hc_smoe`` and ``m_smoe`` (MAEP's merging baselines).

A :class:`MergeMethod` is named and configured like a calibration criterion (``ExpertPruning(criterion="hc_smoe",
ratio=0.5)``, ``get_criterion("m_smoe", align=False)``) but produces a :class:`~lightprune.experts.merging.MergePlan`
from the run's calibration statistics instead of scores: :meth:`MergeMethod.merge_plan`. Its statistics come from
the observed calibration pass (``ExpertStats(criteria=[..., "expert_outputs"])`` for HC-SMoE, ``"router_logits"``
for M-SMoE: :attr:`MergeMethod.statistic`). The methods themselves: :mod:`lightprune.experts.merging.methods`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from lightprune.core.extras import require
from lightprune.experts.criteria.base import Criterion
from lightprune.experts.criteria.registry import register_criterion
from lightprune.experts.merging.methods import hc_smoe_plan, m_smoe_plan
from lightprune.experts.merging.plan import ROUTER_RULES, MergePlan

__all__ = ["MergeMethod", "HCSMoE", "MSMoE"]


class MergeMethod(Criterion):
    """Base class of the merging methods: :meth:`merge_plan` from calibration statistics."""

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

"""Every statistic of one MoE layer, fed the same `ObservedBatch`: `LayerStatistics`.

The values a pass collects are grouped by the statistic that sums them (the criteria's, found through
`lightprune.experts.criteria.registry`): one instance per statistic and layer, told which of its values are
wanted, beside the layer's `SubsetCounts`. The layer's batch computes what the union of their needs asks for,
once. The saved state is the statistics' flat sums, grouped by
their ``state_group`` (``layers``; the merging statistics' ``merging``), the layout a resumed calibration reads.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from lightprune.experts.calibration.observed import ObservedBatch
from lightprune.experts.criteria.registry import statistic_class
from lightprune.experts.criteria.statistic import Statistic, SubsetCounts
from lightprune.models import MoELayer

__all__ = ["LayerStatistics"]


class LayerStatistics:
    """The statistics of ``values`` (registered value names) for ``layer`` over ``subsets``."""

    def __init__(self, layer: MoELayer, subsets: tuple[str, ...], values: tuple[str, ...]):
        self.index = layer.index
        self.counts = SubsetCounts(layer, subsets)
        groups: dict[type[Statistic], list[str]] = {}
        for name in values:
            groups.setdefault(statistic_class(name), []).append(name)
        self.statistics: list[Statistic] = [cls(layer, subsets, tuple(names), self.counts)
                                            for cls, names in groups.items()]
        self._owner = {name: statistic for statistic in self.statistics for name in statistic.wanted}
        self.needs = frozenset().union(*(statistic.needs for statistic in self.statistics))

    def observe(self, layer: MoELayer, masks: torch.Tensor, samples: torch.Tensor, num_samples: int,
                padded: bool | None, selected: torch.Tensor, router_input: torch.Tensor,
                router_logits: torch.Tensor | None = None, routing_state: object = None) -> ObservedBatch:
        """The layer's batch, its routing part computed for these statistics (before the experts run)."""
        return ObservedBatch(layer, masks, samples, num_samples, padded, selected, router_input, router_logits,
                             routing_state, self.needs)

    @torch.no_grad()
    def update(self, batch: ObservedBatch) -> None:
        """Add the batch (its outputs added) to every statistic."""
        self.counts.update(batch)
        for statistic in self.statistics:
            statistic.update(batch)

    def value(self, name: str, subset: int | None) -> torch.Tensor:
        return self._owner[name].value(name, subset)

    # ------------------------------------------------------------------ state
    def _members(self) -> list[Statistic]:
        return [self.counts, *self.statistics]

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """{state group: {sum name: tensor}}."""
        state: dict[str, dict[str, torch.Tensor]] = {}
        for statistic in self._members():
            state.setdefault(statistic.state_group, {}).update(statistic.state_dict())
        return state

    def groups(self) -> set[str]:
        return {statistic.state_group for statistic in self._members()}

    def load_state_dict(self, state: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
        for statistic in self._members():
            statistic.load_state_dict(state[statistic.state_group])

    def to(self, device: torch.device) -> None:
        """Keep every sum on ``device`` (where a streamed model computes; its layers are on the meta device)."""
        for statistic in self._members():
            statistic.to(device)

    def all_reduce(self, flat: list[torch.Tensor]) -> None:
        """Across ranks: each statistic that sums across ranks its own way (it overrides
        `Statistic.all_reduce`) does so now; the others' sums are appended to ``flat``, for the caller's one
        collective over every layer's."""
        device = self.counts.device
        for statistic in self._members():
            if type(statistic).all_reduce is Statistic.all_reduce:
                flat.extend(statistic.sums.values())
            else:
                statistic.all_reduce(device)

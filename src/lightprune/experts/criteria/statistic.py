"""The shape of what a calibration criterion accumulates: sums for one MoE layer over the token subsets, fed one
`ObservedBatch` at a time by the observed pass.

A `Statistic` holds float64 sums (``sums``, on the layer's device; a layer on the meta device, loaded only
while it runs, keeps them on the CPU unless the observer is told where the model computes), adds one batch in
`Statistic.update` (under ``torch.no_grad``, no host synchronisation beyond what the batch already did), turns
its sums into a value per expert in `Statistic.value`, round-trips through `state_dict` /
`load_state_dict` (flat names, disjoint from the other statistics' of the layer: a resumed calibration loads
them) and is summed across ranks at decision points only: its sums in the observer's one flat collective, or by its
own `all_reduce` where a subclass overrides it (a statistic whose sums do not add across ranks).

What it reads of the batch it declares in `Statistic.needs`, so the batch computes only that, once, for
every statistic of the layer: ``"logits"`` (the router's logits), ``"removal"`` (the family's removal effect and
the re-run selections), ``"entering"`` (the outputs of the experts a removal promotes, run in the forward's own
expert call).

`SubsetCounts` (every layer has one) counts the tokens and the samples of each subset; statistics that
average over them read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from lightprune.models import MoELayer

__all__ = ["Statistic", "SubsetCounts", "sums_device", "compute_dtype", "CHUNK_ELEMENTS"]

#: elements per masked-selection call and per Delta-H chunk (rows x E logits, rows x H promoted changes)
CHUNK_ELEMENTS = 1 << 22


def compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """float32, or the tensor's dtype when it is wider (a float64 reference stays float64)."""
    return torch.promote_types(tensor.dtype, torch.float32)


def sums_device(layer: MoELayer) -> torch.device:
    """Where a layer's sums live: its router's device (the CPU for a layer on the meta device)."""
    device = layer.router_linear.weight.device
    return torch.device("cpu") if device.type == "meta" else device


class Statistic:
    """Sums of one statistic for one MoE layer (see the module docstring).

    Subclasses set `values`, allocate `sums` in ``__init__`` (through `zeros`) and implement
    `update` and `value`.

    Args:
        layer: the MoE layer.
        subsets: the token subsets, in the order of the rows of the subset masks.
        wanted: which of `values` the pass collects (a statistic may skip work for the others).
        counts: the layer's `SubsetCounts`.
    """

    #: the value names this statistic gives (its registry names)
    values: ClassVar[tuple[str, ...]] = ()
    #: False for values that are not per token subset (the merging statistics: one value per layer)
    per_subset: ClassVar[bool] = True
    #: other values that must be collected with this one (the merges weight experts by frequency)
    requires: ClassVar[tuple[str, ...]] = ()
    #: the group of the observer's saved state its sums go in ("layers"; the merging statistics: "merging")
    state_group: ClassVar[str] = "layers"

    def __init__(self, layer: MoELayer, subsets: tuple[str, ...], wanted: tuple[str, ...],
                 counts: "SubsetCounts | None" = None):
        unknown = [name for name in wanted if name not in self.values]
        if unknown:
            raise ValueError(f"{type(self).__name__} gives {list(self.values)}, not {unknown}")
        self.index, self.num_experts, self.subsets = layer.index, layer.num_experts, subsets
        #: the ids the router selects (the experts, then any identity experts, whose columns a statistic drops)
        self.num_selectable = layer.num_selectable
        self.wanted, self.counts, self.device = tuple(wanted), counts, sums_device(layer)
        self.sums: dict[str, torch.Tensor] = {}

    def zeros(self, *shape: int, device: torch.device | None = None) -> torch.Tensor:
        """A float64 sum of ``shape`` on the sums' device (or ``device``)."""
        return torch.zeros(shape, dtype=torch.float64, device=self.device if device is None else device)

    @property
    def needs(self) -> frozenset[str]:
        """What `update` reads of the batch beyond the routed outputs (module docstring)."""
        return frozenset()

    def update(self, batch) -> None:
        """Add one batch."""
        raise NotImplementedError(f"{type(self).__name__} must implement update(batch)")

    def value(self, name: str, subset: int | None) -> torch.Tensor:
        """Value ``name`` per expert over the tokens of subset row ``subset`` (None for a value not per subset)."""
        raise NotImplementedError(f"{type(self).__name__} must implement value(name, subset)")

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: t.clone() for name, t in self.sums.items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        for name, t in self.sums.items():
            if name not in state or state[name].shape != t.shape:
                raise ValueError(f"layer {self.index}: calibration state has no {name!r} of shape {tuple(t.shape)}")
            t.copy_(state[name])

    def to(self, device: torch.device) -> None:
        """Move the sums to ``device``, where the next batches are added."""
        self.device = device
        self.sums = {name: t.to(device) for name, t in self.sums.items()}

    def all_reduce(self, device: torch.device | None = None) -> None:
        """Sum across ranks in place; ``device``: where the backend reduces (sums held elsewhere move there and
        back). A no-op in one process."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return
        for tensor in self.sums.values():
            if device is None or tensor.device == device:
                torch.distributed.all_reduce(tensor)
            else:
                moved = tensor.to(device)
                torch.distributed.all_reduce(moved)
                tensor.copy_(moved.to(tensor.device))


class SubsetCounts(Statistic):
    """``tokens`` [U]: each subset's tokens; ``samples`` [U]: the samples with at least one token of the subset."""

    def __init__(self, layer: MoELayer, subsets: tuple[str, ...]):
        super().__init__(layer, subsets, ())
        self.sums = {"tokens": self.zeros(len(subsets)), "samples": self.zeros(len(subsets))}

    def update(self, batch) -> None:
        self.sums["tokens"] += batch.m.sum(dim=1).double()
        self.sums["samples"] += (batch.sample_counts > 0).sum(dim=1).double()

    def tokens(self, subset: int) -> torch.Tensor:
        return self.sums["tokens"][subset]

    def samples(self, subset: int) -> torch.Tensor:
        return self.sums["samples"][subset]

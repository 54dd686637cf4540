"""ExpertObserver: the observed calibration pass, one forward per batch -> every criterion for every subset.

`ExpertObserver` is what [`collect_expert_stats`][..collect.collect_expert_stats] and the Lightning
``ExpertStats`` callback drive batch by batch: it routes every MoE layer's experts through the observing implementation
(`lightprune.observe.experts_impl`), attaches an attention probe when an attention subset
is asked for, feeds each layer's `LayerStatistics` one
`ObservedBatch` per batch (its routing part before the layer's experts run, so that the rows the
promoted Delta-H needs run in the same expert call), and restores the model exactly on exit (experts and attention
implementations, no hooks left).

A layer's batch is observed only if its router's input and the logits the router returned (the routing weights of
a router that returns no logits) are finite at every token the statistics read: a NaN or inf there is refused naming
the layer and the batch (its 0-based index in the run: the batches counted before it), not summed into a result. The
checks are queued on the device (`FiniteRoutingChecks`) and read once, by `check_routing`:
before [`result`][], `state_dict` and `all_reduce`, after each pass of a streamed run, and every
few thousand checks; the observed pass itself never waits for the device. Before its first batch of a pass
(a ``with`` block), every tensor the layer's routing reads (router weights and biases, correction biases, per-expert
scales, the router's norm: `routing_tensors`) must be finite too
(`check_routing_tensors`, queued with the batches' checks): a parameter cannot
change between batches, so it is checked once per layer and pass, naming the tensor and the batch it was found
before.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Iterable, Mapping

import torch
from torch import nn

from lightprune.core.checks import check_interval
from lightprune.core.errors import listed
from lightprune.experts.calibration.layer_statistics import LayerStatistics
from lightprune.experts.calibration.observed import FiniteRoutingChecks, ObservedBatch
from lightprune.experts.calibration.result import CalibrationStats
from lightprune.experts.calibration.subsets import ATTENTION_SUBSETS, base_masks, check_subsets
from lightprune.experts.criteria.registry import (
    CALIBRATION_CRITERIA,
    DEFAULT_CRITERIA,
    MERGE_STATISTICS,
    STATISTICS,
    statistic_class,
)
from lightprune.models import MoELayer, find_moe_layers, get_family
from lightprune.observe.attention_probe import AttentionProbe, low_high_masks
from lightprune.observe.experts_impl import observing_experts

__all__ = ["ExpertObserver", "DEFAULT_CRITERIA"]



def _check_not_offloaded(model: nn.Module, layers: list[MoELayer]) -> None:
    """Refuse a model whose MoE layers accelerate offloads (``device_map`` with ``cpu`` / ``disk`` entries beside
    an accelerator, or ``max_memory``): their weights are on the meta device between their own module calls, and
    the observers read a layer's router weights inside its experts' call."""
    offloaded = sorted({layer.name for layer in layers for module in layer.block.modules()
                        if getattr(getattr(module, "_hf_hook", None), "offload", False)})
    if offloaded:
        shown = ", ".join(offloaded[:4]) + (f" and {len(offloaded) - 4} more" if len(offloaded) > 4 else "")
        raise ValueError(f"calibration cannot observe MoE layers that accelerate offloads ({shown}): their weights "
                         "are loaded only while each module runs. Load the model without offloading, or stream the "
                         "checkpoint one decoder layer at a time: lp.collect_expert_stats(checkpoint_dir, batches)")


def _resolve(criteria: Iterable[str] | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(per-subset values, per-layer values) to collect for ``criteria`` (None: `DEFAULT_CRITERIA`), each
    statistic's required values added after the ones asked for."""
    criteria = tuple(dict.fromkeys(DEFAULT_CRITERIA if criteria is None else criteria))
    unknown = [c for c in criteria if c not in STATISTICS]
    if unknown or not criteria:
        others = sorted(set(STATISTICS.names()) - set(CALIBRATION_CRITERIA) - set(MERGE_STATISTICS))
        raise ValueError(f"unknown calibration criteria {list(unknown or criteria)}; choose from "
                         f"{CALIBRATION_CRITERIA} and the merging statistics {MERGE_STATISTICS}"
                         + (f", or the registered {others}" if others else ""))
    classes = {c: statistic_class(c) for c in criteria}
    required = [r for c in criteria for r in classes[c].requires]
    per_subset = tuple(dict.fromkeys([c for c in criteria if classes[c].per_subset] + required))
    return per_subset, tuple(c for c in criteria if not classes[c].per_subset)


class ExpertObserver:
    """Accumulate calibration statistics over forward passes made inside ``with observer:``.

    Call `begin_batch` with each batch before the model's forward on it (the model must
    get the whole batch in one call), then run the forward under ``torch.no_grad()``.
    """

    def __init__(self, model: nn.Module, subsets: Iterable[str] = ("all",), criteria: Iterable[str] | None = None,
                 low_attn_quantile: float = 0.02, device: torch.device | str | None = None):
        self.model = model
        self.family = get_family(model)
        self.layers: list[MoELayer] = find_moe_layers(model)
        _check_not_offloaded(model, self.layers)
        self.vision_token_ids = tuple(getattr(self.family, "vision_token_ids", lambda: ())())
        self.subsets = check_subsets(subsets, self.vision_token_ids)
        self.criteria, self.merging = _resolve(criteria)
        self.low_attn_quantile = check_interval("low_attn_quantile", low_attn_quantile, 0, 0.5, "(]")
        self.statistics = {l.index: LayerStatistics(l, self.subsets, self.criteria + self.merging)
                           for l in self.layers}
        if device is not None:  # a streamed model's layers are on the meta device: its sums go where it computes
            for stats in self.statistics.values():
                stats.to(torch.device(device))
        self._checks = FiniteRoutingChecks()
        self._declared: dict[int, tuple[Mapping[str, Any], dict[str, torch.Tensor], bool]] = {}
        self.batches_seen = 0
        self._stack: ExitStack | None = None
        self._probe = None
        self._masks: dict[str, torch.Tensor] | None = None
        self._padded = True  # whether the declared batch has padding (begin_batch)
        self._batch_index = -1  # the declared batch's 0-based index in the run (begin_batch)
        self._wave_start: int | None = None  # index of the first batch of the latest counted run (None: none yet)
        self._repeat_next = 0  # index of the batch the next uncounted declaration repeats
        self._repeating = False  # whether the last declaration was uncounted
        self._pending: dict[int, ObservedBatch] = {}  # each layer's batch, from before its experts ran
        self._checked: set[int] = set()  # the layers whose routing tensors this pass has checked

    # ------------------------------------------------------------------ context
    def __enter__(self) -> "ExpertObserver":
        self._checked = set()
        stack = ExitStack()
        try:
            stack.enter_context(observing_experts(self.layers, self._observe, extra=self._extra_rows,
                                                 router_logits=True))
            if any(s in ATTENTION_SUBSETS for s in self.subsets):
                self._probe = stack.enter_context(AttentionProbe(self.model, [l.index for l in self.layers]))
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def __exit__(self, *exc: Any) -> None:
        stack, self._stack, self._probe, self._masks = self._stack, None, None, None
        self._pending.clear()
        self._declared.clear()
        if stack is not None:
            stack.close()

    # ------------------------------------------------------------------ per batch
    def begin_batch(self, batch: Mapping[str, Any], count: bool = True, index: int | None = None,
                    remember: bool = False) -> None:
        """Declare the batch whose forward comes next (derives its token subsets). ``count=False``: the same batch
        again, for the next layers of a run that takes the batches through one layer at a time
        (`collect_checkpoint_stats`), which passes ``remember``:
        what is derived from the batch (its subsets, whether it has padding: one host sync) is kept for its next
        declarations, until a counted batch starts the next run.

        ``index``: the batch's 0-based index in the run, for errors (None: a counted batch is the next one; the
        uncounted declarations after a run of counted ones repeat that run's batches in order, layer after layer)."""
        if self._stack is None:
            raise RuntimeError("ExpertObserver.begin_batch outside its with-block")
        if count and self._repeating:  # a new run of batches: the last one's declarations are done with
            self._declared.clear()
        self._batch_index = self._next_index(count) if index is None else int(index)
        found = self._declared.get(id(batch))
        if found is None or found[0] is not batch:
            masks = base_masks(batch, self.vision_token_ids)
            found = (batch, masks, not bool(masks["all"].all()))  # one host sync per batch, for every layer
            if remember:
                self._declared[id(batch)] = found
        _, self._masks, self._padded = found
        if len(self._checks) >= FiniteRoutingChecks.READ_EVERY:
            self._checks.raise_first()
        if self._probe is not None:
            self._probe.set_batch(self._masks["text"], self._masks["vision"])
        if count:
            self.batches_seen += 1

    def _next_index(self, count: bool) -> int:
        """The 0-based index of the batch a declaration names (see `begin_batch`)."""
        if count:
            if self._wave_start is None or self._repeating:
                self._wave_start = self.batches_seen
            self._repeating, self._repeat_next = False, self._wave_start
            return self.batches_seen
        start = self.batches_seen if self._wave_start is None else self._wave_start
        index = self._repeat_next
        self._repeating, self._repeat_next = True, index + 1 if index + 1 < self.batches_seen else start
        return index

    def _subset_masks(self, layer: MoELayer) -> torch.Tensor:
        masks = self._masks
        rows = []
        for subset in self.subsets:
            if subset in ATTENTION_SUBSETS:
                scores = self._probe.layer_scores(layer.index)
                low, high = low_high_masks(scores, masks["vision"], self.low_attn_quantile)
                rows.append(low if subset == "vision_low_attn" else high)
            else:
                rows.append(masks[subset])
        return torch.stack(rows).reshape(len(rows), -1)

    def _batch_masks(self, layer: MoELayer, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(subset masks [U, T], sample of each token [T], samples) of the declared batch, checked against
        ``hidden``."""
        if self._masks is None:
            raise RuntimeError("a forward ran inside ExpertObserver without begin_batch(batch) first")
        batch, seq = self._masks["all"].shape
        if hidden.shape[0] != batch * seq:
            raise RuntimeError(f"layer {layer.index} saw {hidden.shape[0]} tokens, the declared batch has "
                               f"{batch} x {seq}: pass the whole batch in one forward")
        masks = self._subset_masks(layer).to(hidden.device)
        return masks, torch.arange(batch, device=hidden.device).repeat_interleave(seq), batch

    def _layer_batch(self, layer: MoELayer, hidden: torch.Tensor, router_input: torch.Tensor,
                     selected: torch.Tensor, router_logits: torch.Tensor | None,
                     routing_state: object) -> ObservedBatch:
        """The layer's `ObservedBatch` of the declared batch, its routing checked finite first (its routing
        tensors once per pass, before the first batch the layer sees; a streamed layer is in memory only now)."""
        masks, samples, batch_size = self._batch_masks(layer, hidden)
        if layer.index not in self._checked:
            self._checks.add_routing_tensors(layer, self._batch_index)
            self._checked.add(layer.index)
        self._checks.add(layer, self._batch_index, router_input, router_logits,
                         masks.any(dim=0) if self._padded else None, self._masks["all"].shape[1])
        return self.statistics[layer.index].observe(layer, masks, samples, batch_size, self._padded, selected,
                                                    router_input, router_logits, routing_state)

    def _extra_rows(self, layer: MoELayer, hidden: torch.Tensor, router_input: torch.Tensor,
                    selected: torch.Tensor, router_logits: torch.Tensor | None = None,
                    routing_state: object = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Before the layer's experts run: its batch's routing part, and the rows it asks the expert call for."""
        batch = self._layer_batch(layer, hidden, router_input, selected, router_logits, routing_state)
        self._pending[layer.index] = batch
        return batch.extra_rows

    def _observe(self, layer: MoELayer, hidden: torch.Tensor, router_input: torch.Tensor, selected: torch.Tensor,
                 weights: torch.Tensor, outputs: torch.Tensor, extra_outputs: torch.Tensor | None = None,
                 router_logits: torch.Tensor | None = None, routing_state: object = None) -> None:
        batch = self._pending.pop(layer.index, None)
        if batch is None or batch.selected is not selected:  # not the routing it was prepared for: the rows it
            # asked for did not run
            batch = self._layer_batch(layer, hidden, router_input, selected, router_logits, routing_state)
            extra_outputs = None
        if router_logits is None:  # a router that returns no logits (Gemma 4: probabilities): its weights stand in
            self._checks.add(layer, self._batch_index, router_input, weights, batch.keep if batch.padded else None,
                             self._masks["all"].shape[1], "routing weights")
        batch.add_outputs(hidden, weights, outputs, extra_outputs)
        self.statistics[layer.index].update(batch)

    def check_routing(self) -> None:
        """Read the queued non-finite routing checks (one host sync) and raise for the first batch and layer that
        failed (`FiniteRoutingChecks`)."""
        self._checks.raise_first()

    # ------------------------------------------------------------------ results
    def result(self) -> CalibrationStats:
        """The statistics so far; an error when a subset saw no tokens at all."""
        self.check_routing()
        values: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
        for index, stats in self.statistics.items():
            for u, subset in enumerate(self.subsets):
                for name in self.criteria:
                    values.setdefault((name, subset), {})[index] = stats.value(name, u)
        counts = next(iter(self.statistics.values())).counts
        tokens = {subset: int(counts.tokens(u).item()) for u, subset in enumerate(self.subsets)}
        samples = {subset: int(counts.samples(u).item()) for u, subset in enumerate(self.subsets)}
        for subset in self.subsets:
            if tokens[subset] == 0:
                hint = " (do the batches contain images?)" if subset not in ("all", "text") else ""
                raise ValueError(f"no calibration tokens of subset {subset!r} in {self.batches_seen} batches{hint}")
        merging = {name: {index: stats.value(name, None) for index, stats in self.statistics.items()}
                   for name in self.merging}
        limits = {l.index: l.limits for l in self.layers}
        return CalibrationStats(values, limits, samples=samples, tokens=tokens, merging=merging,
                                metadata={"batches": self.batches_seen, "low_attn_quantile": self.low_attn_quantile,
                                          "criteria": list(self.criteria) + list(self.merging),
                                          "subsets": list(self.subsets)})

    def state_dict(self) -> dict[str, Any]:
        """``{"batches_seen", "layers": {layer: {sum: tensor}}}``, and ``"merging"`` likewise with merging
        statistics."""
        self.check_routing()  # a saved state holds no batch that would have been refused
        state: dict[str, Any] = {"batches_seen": self.batches_seen}
        for index, stats in self.statistics.items():
            for group, sums in stats.state_dict().items():
                state.setdefault(group, {})[index] = sums
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        groups: dict[str, Mapping[Any, Any]] = {}
        for group in sorted(set().union(*(stats.groups() for stats in self.statistics.values()))):
            saved = state.get(group)
            if saved is None and group == "merging":
                raise ValueError(f"calibration state has no merging statistics {list(self.merging)}: it was "
                                 "collected without them")
            missing = sorted(set(self.statistics) - {int(k) for k in (saved or {})})
            if missing:
                raise ValueError(f"calibration state has no {group} sums for layers {listed(missing)}")
            groups[group] = saved
        for index, stats in self.statistics.items():
            stats.load_state_dict({group: sums[index] if index in sums else sums[str(index)]
                                   for group, sums in groups.items() if group in stats.groups()})
        self.batches_seen = int(state.get("batches_seen", 0))
        self._wave_start, self._repeating = None, False  # the next counted batch starts a run

    def all_reduce(self) -> None:
        """Sum every layer's statistics and the batches seen across ranks (torch.distributed), in place: every sum of
        every layer in one flat float64 buffer, one collective (a no-op in one process; a statistic with its own
        `all_reduce` runs it). The ranks first agree that every one's batches passed the
        routing checks (a failed rank's error is raised on every rank, so none waits in the sum)."""
        from lightprune.core.distributed import is_distributed, raise_on_every_rank

        raise_on_every_rank(self.check_routing)
        if not is_distributed() or not self.statistics:
            return
        sums: list[torch.Tensor] = []
        for stats in self.statistics.values():
            stats.all_reduce(sums)
        device = next(iter(self.statistics.values())).counts.device  # where the backend reduces (gloo: the CPU)
        flat = torch.cat([t.reshape(-1).to(device=device, dtype=torch.float64) for t in sums]
                         + [torch.tensor([float(self.batches_seen)], dtype=torch.float64, device=device)])
        torch.distributed.all_reduce(flat)
        offset = 0
        for tensor in sums:
            tensor.copy_(flat[offset:offset + tensor.numel()].view(tensor.shape))
            offset += tensor.numel()
        self.batches_seen = int(flat[offset].item())

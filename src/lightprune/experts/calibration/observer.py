"""ExpertObserver: the observed calibration pass, one forward per batch -> every criterion for every subset.

:class:`ExpertObserver` is what :func:`~lightprune.experts.calibration.collect_expert_stats` and the Lightning
``ExpertStats`` callback drive batch by batch: it routes every MoE layer's experts through the observing implementation
(:mod:`lightprune.observe.experts_impl`), attaches an attention probe when an attention subset
is asked for, feeds :class:`~.accumulate.LayerAccumulator` per layer, and restores the model
exactly on exit (experts and attention implementations, no hooks left).
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Iterable, Mapping

import torch
from torch import nn

from lightprune.experts.calibration.accumulate import LayerAccumulator
from lightprune.experts.calibration.merge_sums import MERGE_STATISTICS, MergeSums
from lightprune.experts.calibration.result import CRITERIA, CalibrationStats
from lightprune.experts.calibration.subsets import ATTENTION_SUBSETS, base_masks, check_subsets
from lightprune.models import MoELayer, find_moe_layers, get_family
from lightprune.observe.attention_probe import AttentionProbe, low_high_masks
from lightprune.observe.experts_impl import observing_experts

__all__ = ["ExpertObserver", "DEFAULT_CRITERIA"]

#: every criterion but the optional delta_h_promoted (which runs promoted experts again)
DEFAULT_CRITERIA = tuple(c for c in CRITERIA if c != "delta_h_promoted")


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


class ExpertObserver:
    """Accumulate calibration statistics over forward passes made inside ``with observer:``.

    Call :meth:`begin_batch` with each batch before the model's forward on it (the model must
    get the whole batch in one call), then run the forward under ``torch.no_grad()``.
    """

    def __init__(self, model: nn.Module, subsets: Iterable[str] = ("all",), criteria: Iterable[str] | None = None,
                 low_attn_quantile: float = 0.02):
        self.model = model
        self.family = get_family(model)
        self.layers: list[MoELayer] = find_moe_layers(model)
        _check_not_offloaded(model, self.layers)
        self.vision_token_ids = tuple(getattr(self.family, "vision_token_ids", lambda: ())())
        self.subsets = check_subsets(subsets, self.vision_token_ids)
        criteria = tuple(dict.fromkeys(DEFAULT_CRITERIA if criteria is None else criteria))
        unknown = [c for c in criteria if c not in CRITERIA + MERGE_STATISTICS]
        if unknown or not criteria:
            raise ValueError(f"unknown calibration criteria {unknown or criteria}; choose from {CRITERIA} and the "
                             f"merging statistics {MERGE_STATISTICS}")
        merging = tuple(c for c in criteria if c in MERGE_STATISTICS)
        # the merges weight experts by routing frequency: collected with any merging statistic
        self.criteria = tuple(dict.fromkeys([c for c in criteria if c in CRITERIA]
                                            + (["frequency"] if merging else [])))
        self.merging = merging
        if not 0.0 < low_attn_quantile <= 0.5:
            raise ValueError(f"low_attn_quantile must be in (0, 0.5], got {low_attn_quantile!r}")
        self.low_attn_quantile = float(low_attn_quantile)
        self.accumulators = {l.index: LayerAccumulator(l, self.subsets, self.criteria) for l in self.layers}
        self.merge_sums = {l.index: MergeSums(l, merging) for l in self.layers} if merging else {}
        self.batches_seen = 0
        self._stack: ExitStack | None = None
        self._probe = None
        self._masks: dict[str, torch.Tensor] | None = None
        self._padded = True  # whether the declared batch has padding (begin_batch)
        self._layer_masks: tuple | None = None  # (selected, _batch_masks) from _extra_rows, for _observe

    # ------------------------------------------------------------------ context
    def __enter__(self) -> "ExpertObserver":
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
        if stack is not None:
            stack.close()

    # ------------------------------------------------------------------ per batch
    def begin_batch(self, batch: Mapping[str, Any], count: bool = True) -> None:
        """Declare the batch whose forward comes next (derives its token subsets). ``count=False``: the same batch
        again, for the next layers of a run that takes the batches through one layer at a time
        (:func:`~lightprune.experts.calibration.sequential.collect_checkpoint_stats`)."""
        if self._stack is None:
            raise RuntimeError("ExpertObserver.begin_batch outside its with-block")
        masks = base_masks(batch, self.vision_token_ids)
        self._masks = masks
        self._padded = not bool(masks["all"].all())  # one host sync per batch, for every layer's accumulator
        if self._probe is not None:
            self._probe.set_batch(masks["text"], masks["vision"])
        if count:
            self.batches_seen += 1

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

    def _extra_rows(self, layer: MoELayer, hidden: torch.Tensor, router_input: torch.Tensor,
                    selected: torch.Tensor, router_logits: torch.Tensor | None = None,
                    routing_state: object = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        self._layer_masks = (selected, self._batch_masks(layer, hidden))  # _observe of the same routing reuses them
        return self.accumulators[layer.index].prepare(layer, router_input, selected, self._layer_masks[1][0],
                                                      self._padded, router_logits, routing_state)

    def _observe(self, layer: MoELayer, hidden: torch.Tensor, router_input: torch.Tensor, selected: torch.Tensor,
                 weights: torch.Tensor, outputs: torch.Tensor, extra_outputs: torch.Tensor | None = None,
                 router_logits: torch.Tensor | None = None, routing_state: object = None) -> None:
        prepared, self._layer_masks = self._layer_masks, None
        masks, samples, batch = prepared[1] if prepared is not None and prepared[0] is selected else \
            self._batch_masks(layer, hidden)
        self.accumulators[layer.index].update(layer, hidden, selected, weights, outputs, masks, samples, batch,
                                              router_input, extra_outputs=extra_outputs, padded=self._padded,
                                              router_logits=router_logits, routing_state=routing_state)
        if self.merge_sums:
            self.merge_sums[layer.index].update(layer, hidden, hidden if router_input is None else router_input,
                                                masks.any(dim=0))

    # ------------------------------------------------------------------ results
    def result(self) -> CalibrationStats:
        """The statistics so far; an error when a subset saw no tokens at all."""
        values: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
        tokens: dict[str, int] = {}
        samples: dict[str, int] = {}
        for index, acc in self.accumulators.items():
            for key, value in acc.values().items():
                values.setdefault(key, {})[index] = value
        first = next(iter(self.accumulators.values()))
        for u, subset in enumerate(self.subsets):
            tokens[subset] = int(first.sums["tokens"][u].item())
            samples[subset] = int(first.sums["samples"][u].item())
            if tokens[subset] == 0:
                raise ValueError(f"no calibration tokens of subset {subset!r} in {self.batches_seen} batches"
                                 + (" (do the batches contain images?)" if subset != "all" and subset != "text" else ""))
        limits = {l.index: l.limits for l in self.layers}
        merging: dict[str, dict[int, torch.Tensor]] = {}
        for index, sums in self.merge_sums.items():
            for name, value in sums.means().items():
                merging.setdefault(name, {})[index] = value
        return CalibrationStats(values, limits, samples=samples, tokens=tokens, merging=merging,
                                metadata={"batches": self.batches_seen, "low_attn_quantile": self.low_attn_quantile,
                                          "criteria": list(self.criteria) + list(self.merging),
                                          "subsets": list(self.subsets)})

    def state_dict(self) -> dict[str, Any]:
        state = {"batches_seen": self.batches_seen,
                 "layers": {index: acc.state_dict() for index, acc in self.accumulators.items()}}
        if self.merge_sums:
            state["merging"] = {index: sums.state_dict() for index, sums in self.merge_sums.items()}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        layers = state.get("layers", {})
        missing = sorted(set(self.accumulators) - {int(k) for k in layers})
        if missing:
            raise ValueError(f"calibration state has no accumulators for layers {missing}")
        for index, acc in self.accumulators.items():
            acc.load_state_dict(layers[index] if index in layers else layers[str(index)])
        if self.merge_sums:
            merging = state.get("merging")
            if merging is None:
                raise ValueError(f"calibration state has no merging statistics {list(self.merging)}: it was "
                                 "collected without them")
            for index, sums in self.merge_sums.items():
                sums.load_state_dict(merging[index] if index in merging else merging[str(index)])
        self.batches_seen = int(state.get("batches_seen", 0))

    def all_reduce(self) -> None:
        """Sum the accumulators across ranks (torch.distributed), in place; a no-op in one process."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return
        for acc in self.accumulators.values():
            for tensor in acc.sums.values():
                torch.distributed.all_reduce(tensor)
        device = next(iter(self.accumulators.values())).sums["tokens"].device  # the backend's device
        for sums in self.merge_sums.values():  # held on the CPU: reduced on the accumulators' device
            for tensor in sums.sums.values():
                moved = tensor.to(device)
                torch.distributed.all_reduce(moved)
                tensor.copy_(moved.cpu())

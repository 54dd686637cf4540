"""One MoE layer's view of one calibration batch, computed once for every statistic: `ObservedBatch`.

For one layer and one batch the observer gets, before the layer's experts run, the selected experts S [T, k], what
the router saw and, where the family's router returns them, its logits and the routing state its observed router
kept; after they run, the experts' input h [T, H], the weights applied w [T, k] and the selected experts' unweighted
outputs f [T, k, H] (the quantities of MAEP ("Modality-Aware Expert Pruning for MoE-Based Multimodal Large Language
Models", arXiv 2611.05927), section 3.1, Eq. 1). From these the batch computes, each once and only when a
statistic of the layer reads it:

- the routing part (before the experts): the router logits [T, E] (read, or recomputed from the router's input),
  the family's [`RemovalEffect`][lightprune.models.base.RemovalEffect] and the re-run selections (`reruns`), and the
  (token, expert) rows whose outputs the promoted Delta-H reads, so that they run in the forward's own expert call
  (a swap's entering expert and a re-run pair's, once each);
- the outputs part: the subset masks ``m`` [U, T] in the compute dtype (float32, or the outputs' dtype when wider),
  the weights ``w`` each output gets in the block (times the family's output scale), ``f``, the Gram matrix
  G = f f^T [T, k, k], the output norms ||f_s|| [T, k], the subset tokens per sample [U, B] and each token's weight
  in its sample's mean [U, T].

Non-finite routing: a NaN or inf in the router's input or logits at a token the statistics read is refused naming the
batch and the layer (`FiniteRoutingChecks`: the observer queues one device-side check per layer and batch and
reads them once per pass, before any result or saved state); one in a tensor the
routing reads (a correction bias leaves the logits finite and skews the selection alone) is refused once per layer and
pass, before its first batch (`lightprune.models.routing_check.check_routing_tensors`, called by the observer).

Padding: the model may leave non-finite values at padded positions and 0 * NaN = NaN, so a batch with padding
zeroes them (logits or the router's input, the experts' input, weights, outputs, the promoted outputs) before
anything is summed; real tokens outside the subsets are finite and weigh 0 through ``m``. The host synchronises only
on counts (the re-run pairs and the distinct promoted rows of a family whose removals have no closed form: they size
the rows run) and once per batch on whether it has padding (the observer).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import torch

from lightprune.experts.calibration.reruns import Reruns, reselect
from lightprune.experts.criteria.statistic import compute_dtype
from lightprune.models import MoELayer, RemovalEffect
from lightprune.models.routing_check import names_and_shapes, routing_tensors_message, routing_tensors_record

__all__ = ["FiniteRoutingChecks", "ObservedBatch", "finite_routing_record", "ROUTING_NEEDS"]

#: the needs that make a batch compute its routing part
ROUTING_NEEDS = frozenset({"logits", "removal", "entering"})


def finite_routing_record(router_input: torch.Tensor, router_logits: torch.Tensor | None,
                          keep: torch.Tensor | None) -> torch.Tensor:
    """[5] int64 on the routing's device, computed there without a host sync: (non-finite tokens, tokens checked, of
    them with a NaN or inf router input, with NaN or inf logits, the first one's index, 0 when none), over the tokens
    the statistics read (``keep`` [T], None: every token)."""
    bad_input = ~torch.isfinite(router_input).all(dim=-1)
    logits = None if router_logits is None else router_logits.reshape(-1, router_logits.shape[-1])
    if logits is not None and logits.shape[0] != bad_input.shape[0]:
        logits = None  # logits of other tokens: the batch refuses them itself
    bad_logits = torch.zeros_like(bad_input) if logits is None else ~torch.isfinite(logits).all(dim=-1)
    if keep is not None:
        keep = keep.to(bad_input.device)
        bad_input, bad_logits = bad_input & keep, bad_logits & keep
    bad = bad_input | bad_logits
    checked = keep.sum() if keep is not None else torch.full((), bad.numel(), device=bad.device)
    first = torch.argmax(bad.to(torch.uint8)) if bad.numel() else torch.zeros((), dtype=torch.long, device=bad.device)
    return torch.stack([bad.sum(), checked.long(), bad_input.sum(), bad_logits.sum(), first])


class FiniteRoutingChecks:
    """The non-finite routing checks of a pass, kept on the device and read by the host once. Two kinds, queued in
    the order the observer meets them: what each MoE layer's router saw or returned at the tokens the statistics
    read (`add`, per layer and batch), and the tensors its routing reads (`add_routing_tensors`, per layer
    and pass). Queuing runs only device operations (the first failing check's record is kept with ``torch.where``);
    `raise_first` reads one flag and raises ``ValueError`` for the first check that failed, naming the batch
    (0-based index in the run), the layer (index, module name) and what was not finite, as a check at the batch would
    have. A pass with many batches is read every `READ_EVERY` checks, so the host keeps little."""

    #: checks between two reads when nothing else reads them
    READ_EVERY = 4096
    #: the length records are padded to (the longest kind's)
    WIDTH = 6

    def __init__(self) -> None:
        self._said: list[Callable[[list[int]], str]] = []  # per check: its message from its read record
        self._first: torch.Tensor | None = None  # the first failing check's number (-1: none yet)
        self._record: torch.Tensor | None = None  # its record

    def __len__(self) -> int:
        return len(self._said)

    def add(self, layer: MoELayer, batch_index: int, router_input: torch.Tensor, router_logits: torch.Tensor | None,
            keep: torch.Tensor | None, seq_len: int = 0, logits_name: str = "router logits") -> None:
        """Queue the check of one layer's batch (`finite_routing_record`; ``logits_name`` says what
        ``router_logits`` are, ``seq_len`` places the first bad token as sample and position)."""
        def said(record: list[int]) -> str:
            bad, checked, bad_input, bad_logits, token = record[:5]
            at = f"sample {token // seq_len}, position {token % seq_len}" if seq_len > 0 else f"token {token}"
            return (f"calibration batch {batch_index}, MoE layer {layer.index} ({layer.name}): {bad} of {checked} "
                    f"tokens have a NaN or inf router input ({bad_input}) or {logits_name} ({bad_logits}), the first "
                    f"at {at}; their statistics would be NaN. Check the batch (a NaN embedding, pixel values) and "
                    "the layer's router weights")
        self._queue(finite_routing_record(router_input, router_logits, keep), said)

    def add_routing_tensors(self, layer: MoELayer, batch_index: int) -> None:
        """Queue the check of the tensors the layer's routing reads
        (`routing_tensors_record`), found before batch ``batch_index``."""
        found = routing_tensors_record(layer)
        if found is None:
            return
        record, tensors = found[0], names_and_shapes(found[1])  # not the tensors: a streamed layer is released
        self._queue(record, lambda values: routing_tensors_message(
            layer, values, tensors, f"calibration, before batch {batch_index}",
            "its statistics would be skewed (the selection reads it)"))

    def _queue(self, record: torch.Tensor, said: Callable[[list[int]], str]) -> None:
        record = torch.nn.functional.pad(record, (0, self.WIDTH - record.numel()))
        if self._first is not None and self._first.device != record.device:
            self.raise_first()  # layers on several devices: the earlier ones' checks are read first
        if self._first is None:
            self._first = torch.full((), -1, dtype=torch.long, device=record.device)
            self._record = torch.zeros_like(record)
        number = len(self._said)
        self._said.append(said)
        failed = (record[0] > 0) & (self._first < 0)
        self._first = torch.where(failed, torch.full_like(self._first, number), self._first)
        self._record = torch.where(failed, record, self._record)

    def raise_first(self) -> None:
        """Read the checks queued so far (one host sync) and forget them; raise for the first that failed."""
        if not self._said:
            return
        said, first, record = self._said, self._first, self._record
        self._said, self._first, self._record = [], None, None
        number = int(first)
        if number >= 0:
            raise ValueError(said[number](record.tolist()))


def _zero(tensor: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=tensor.dtype, device=tensor.device)


class ObservedBatch:
    """See the module docstring. Built before the layer's experts run (the routing part, for ``needs``); the
    experts' outputs are added with `add_outputs`.

    Args:
        layer: the MoE layer.
        masks: [U, T] bool, each subset's tokens (padding excluded).
        samples: [T] the sample of each token; ``num_samples``: the batch's samples.
        padded: whether the batch has padding (None: read from ``masks``, one host sync).
        selected: [T, k] the experts the router selected.
        router_input: [T, H'] what the router saw.
        router_logits: the logits the router returned for it (None: recomputed from ``router_input``).
        routing_state: what the family's observed router kept in that call (for its removal effect).
        needs: what the layer's statistics read (`needs`).
    """

    def __init__(self, layer: MoELayer, masks: torch.Tensor, samples: torch.Tensor, num_samples: int,
                 padded: bool | None, selected: torch.Tensor, router_input: torch.Tensor,
                 router_logits: torch.Tensor | None = None, routing_state: object = None,
                 needs: frozenset[str] = frozenset()):
        self.layer, self.masks, self.samples, self.num_samples, self.selected = (layer, masks, samples, num_samples,
                                                                                  selected)
        self.router_input = router_input
        self.keep = masks.any(dim=0)                                         # [T]: in some subset
        self.padded = not bool(self.keep.all()) if padded is None else padded
        self.logits: torch.Tensor | None = None
        self.effect: RemovalEffect | None = None
        self.reruns: Reruns | None = None
        #: (tokens, experts) of the rows to run beside the routed ones (None: none), and where each token's swap
        #: expert [T] and each re-run pair's entering expert [pairs] are among them
        self.extra_rows: tuple[torch.Tensor, torch.Tensor] | None = None
        self.swap_index: torch.Tensor | None = None
        self.pair_index: torch.Tensor | None = None
        self.swap_outputs: torch.Tensor | None = None
        self.rerun_outputs: torch.Tensor | None = None
        if needs & ROUTING_NEEDS:
            self._route(router_input, router_logits, routing_state, needs)

    # ------------------------------------------------------------------ before the experts
    def _route(self, router_input: torch.Tensor, router_logits: torch.Tensor | None, routing_state: object,
               needs: frozenset[str]) -> None:
        layer, selected = self.layer, self.selected
        keep = self.keep.unsqueeze(-1)
        if router_logits is not None:
            logits = router_logits.reshape(-1, layer.num_selectable)
            if logits.shape[0] != selected.shape[0]:
                raise RuntimeError(f"layer {layer.index}: the router returned logits for {logits.shape[0]} tokens, "
                                   f"its experts got {selected.shape[0]}")
            if self.padded:  # the routing state stays: it differs only at padded rows (weight 0), and an observed
                # router keeps none for non-finite logits
                logits = torch.where(keep, logits, _zero(logits))
        else:
            routing_state = None
            if self.padded:
                router_input = torch.where(keep, router_input, _zero(router_input))
            logits = layer.family.router_logits(layer, router_input)
        self.logits = logits
        if not needs & {"removal", "entering"}:
            return
        self.effect = layer.family.removal_effect(layer, logits, selected, routing_state)
        self.reruns = reselect(layer, logits, selected, self.effect, "entering" in needs)
        if "entering" in needs:
            self._entering_rows()

    def _entering_rows(self) -> None:
        """Every (token, expert) row the promoted Delta-H reads, once: a swap's entering expert is often one that
        enters a re-run pair's selection of the same token too."""
        num_experts, device, reruns = self.layer.num_selectable, self.selected.device, self.reruns
        keys = [reruns.pair_token.to(device) * num_experts + reruns.pair_expert.to(device)]
        swaps = 0
        if self.effect.swap_expert is not None:
            swaps = self.selected.shape[0]
            keys.insert(0, torch.arange(swaps, device=device) * num_experts + self.effect.swap_expert.to(device))
        if swaps and not reruns.pair_token.numel():  # swaps alone: one row per token, distinct and in order already
            rows, index = keys[0], torch.arange(swaps, device=device)  # (no unique: it reads its count on the host)
        else:
            rows, index = torch.unique(torch.cat(keys), return_inverse=True)
        self.swap_index, self.pair_index = (index[:swaps] if swaps else None), index[swaps:]
        self.extra_rows = (rows // num_experts, rows % num_experts)

    # ------------------------------------------------------------------ after the experts
    def add_outputs(self, hidden: torch.Tensor, weights: torch.Tensor, outputs: torch.Tensor,
                    extra_outputs: torch.Tensor | None = None) -> None:
        """The experts' input [T, H], the weights applied [T, k], the routed outputs [T, k, H] and the outputs of
        `extra_rows` [n, H] (None when they did not run in the forward: the promoted Delta-H runs them)."""
        if self.padded:
            keep = self.keep
            hidden = torch.where(keep.unsqueeze(-1), hidden, _zero(hidden))
            weights = torch.where(keep.unsqueeze(-1), weights, _zero(weights))
            outputs = torch.where(keep.view(-1, 1, 1), outputs, _zero(outputs))
        self.hidden = hidden
        self.dtype = dtype = compute_dtype(outputs)
        self.m = self.masks.to(dtype)                                        # [U, T]
        self.w = weights.to(dtype) * self.layer.family.output_scale(self.layer)  # the weight each output gets
        self.f = outputs.to(dtype)                                           # [T, k, H]
        if extra_outputs is not None:
            self._extra_outputs(extra_outputs.to(dtype))

    def _extra_outputs(self, extra: torch.Tensor) -> None:
        index = self.swap_index
        swap = None if index is None else extra.index_select(0, index.to(extra.device))
        rerun = extra.index_select(0, self.pair_index.to(extra.device))
        if self.padded:  # a padded token's expert output may be NaN
            keep = self.keep
            if swap is not None:
                swap = torch.where(keep.unsqueeze(-1), swap, 0.0)
            rerun = torch.where(keep[self.reruns.pair_token.to(keep.device)].unsqueeze(-1), rerun, 0.0)
        self.swap_outputs, self.rerun_outputs = swap, rerun

    @cached_property
    def gram(self) -> torch.Tensor:
        """G = f f^T [T, k, k]: f_s . f_r."""
        return torch.bmm(self.f, self.f.transpose(1, 2))

    @cached_property
    def norms(self) -> torch.Tensor:
        """||f_s|| [T, k]."""
        return self.gram.diagonal(dim1=1, dim2=2).clamp_min(0).sqrt()

    @cached_property
    def sample_counts(self) -> torch.Tensor:
        """[U, B]: each subset's tokens per sample."""
        counts = torch.zeros(self.m.shape[0], self.num_samples, dtype=self.dtype, device=self.hidden.device)
        return counts.index_add_(1, self.samples, self.m)

    @cached_property
    def sample_weight(self) -> torch.Tensor:
        """[U, T]: each token's weight in its sample's mean over the subset's tokens (0 outside the subset)."""
        return self.m / self.sample_counts.clamp_min(1)[:, self.samples]

"""Router sensitivity under lightweight fine-tuning ("Router Sensitivity Under Lightweight Fine-Tuning Identifies
Prunable Experts in Mixture-of-Experts Models", arXiv 2608.07890, sections 3.2-3.4, appendix D).

A parameter-efficient adapter is fitted briefly; the adapted model is an instrument, read and
then discarded. Two scores per MoE layer and expert ``e``:

- weight delta (Eq. 4), the router row ``w_e`` before (``0``) and after (``T``) adaptation, the
  adapter merged::

      s_e = | ||w_e(T)||_2 - ||w_e(0)||_2 |        signed (Eq. 3): Delta_e = ||w_e(T)|| - ||w_e(0)||

- logit delta (Eq. 5), for adapters that leave the router frozen (IA3, Houlsby, LoRA off the
  router): with ``L_base``, ``L_adapt`` [N, E] the router logits of N held-out tokens::

      s_e = ||L_adapt[:, e] - L_base[:, e]||_2 / sqrt(N)

Experts with the **smallest** score are pruned first (section 3.4), so importance = score
(for the signed variant: Delta_e, the largest kept, as Chowdhury et al. state it). A weight
delta that is exactly zero everywhere means the router was not trained: that is an error that
points to the logit delta.

Routers wrapped by an adapter (peft ``ParamWrapper`` / ``LoraLayer`` keep the original module as
``base_layer``) are read through their innermost module: its ``weight`` is the original weight
outside a forward, and inside its own forward it is the weight the adapted model uses, which is
what the hooks of [`router_logits`][] and `effective_router_weights` read.

Under DeepSpeed ZeRO-3 a router weight is a partition on each rank: [`router_row_norms`][]
gathers one router at a time (`lightprune.core.distributed.gathered`; a collective, so every
rank calls it); the logit hooks run inside the router's forward, where ZeRO-3 has gathered it.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator, Mapping

import torch
from torch import nn

from lightprune.core.batch import head_skipped, model_inputs
from lightprune.core.choices import SENSITIVITY_SCORES
from lightprune.core.distributed import gathered
from lightprune.core.errors import listed
from lightprune.experts.scores import ExpertScores
from lightprune.models import MoELayer, RoutingLimits, find_moe_layers
from lightprune.models.unwrap import base_model_of

__all__ = ["router_row_norms", "weight_delta", "router_logits", "logit_delta", "VacuousScoreError", "WEIGHT_SCORES",
           "SCORES"]

#: scores read from router weights / from router logits
SCORES = SENSITIVITY_SCORES
WEIGHT_SCORES = tuple(score for score in SCORES if score != "logit")


class VacuousScoreError(ValueError):
    """Every score is zero: the adaptation did not touch what the score reads."""


def innermost_router(router: nn.Module) -> nn.Module:
    """The family's own router module under any adapter wrappers (``base_layer`` chains)."""
    while isinstance(getattr(router, "base_layer", None), nn.Module):
        router = router.base_layer
    return router


def _layers(model: nn.Module) -> list[MoELayer]:
    return find_moe_layers(base_model_of(model))


def _limits(limits: Mapping[int, RoutingLimits] | None, model: nn.Module | None) -> dict[int, RoutingLimits] | None:
    if limits is not None:
        return dict(limits)
    if model is not None:
        return ExpertScores.limits_of(_layers(model))
    return None


def _checked_weight(layer: MoELayer, weight: torch.Tensor) -> torch.Tensor:
    if weight.dim() != 2 or weight.shape[0] != layer.num_experts:
        raise ValueError(f"layer {layer.index} ({layer.name}): router weight has shape {tuple(weight.shape)}, "
                         f"expected [{layer.num_experts}, hidden]. A ZeRO-3 partitioned weight must be gathered "
                         "first (lightprune.core.distributed.gathered)")
    return weight


def _own_weight(router: nn.Module) -> torch.Tensor:
    """The router's stored weight: under a torch parametrization (IA3 channel scales) the original."""
    from torch.nn.utils import parametrize

    if parametrize.is_parametrized(router, "weight"):
        return router.parametrizations.weight.original
    return router.weight


def _row_norms(weight: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(weight.detach().double(), 2, dim=1).cpu()


def router_row_norms(model: nn.Module) -> dict[int, torch.Tensor]:
    """``{layer: tensor[E]}``: float64 L2 norm of every router row of the model's *own* weights.

    For a model with adapters this is the original (un-adapted) router: peft keeps it as the
    wrapper's ``base_layer`` and applies the adapter only inside a forward; a torch
    parametrization (IA3 channel scales) keeps it as ``parametrizations.weight.original``. Use
    `effective_router_weights` (or the adapters module's ``merged_router_weights``) for the
    adapted rows. Under ZeRO-3 each router is gathered in turn (every rank must call this).
    """
    norms = {}
    for layer in _layers(model):
        router = innermost_router(layer.router_linear)
        with gathered(router.parameters()):  # ZeRO-3: this router only
            norms[layer.index] = _row_norms(_checked_weight(layer, _own_weight(router)))
    return norms


@torch.no_grad()
def effective_router_weights(model: nn.Module) -> dict[int, torch.Tensor]:
    """``{layer: W[E, H]}``: the router weight the adapted model routes with (adapter merged).

    Each router is called once on a single zero token; a hook on its innermost module reads
    ``weight`` inside that call, where weight-space adapters (peft LoRA ``target_parameters``) are
    active. The model is not changed. An IA3 input scale implemented as a parametrization of the
    router weight shows here as ``W diag(a)``; the adapters module's ``merged_router_weights``
    (which the RouterDelta callback prefers) reports only weight-space (LoRA) deltas.
    """
    found: dict[int, torch.Tensor] = {}
    for layer in _layers(model):
        inner = innermost_router(layer.router_linear)
        seen: list[torch.Tensor] = []

        def grab(module: nn.Module, args: Any, output: Any, seen=seen) -> None:
            seen.append(module.weight.detach().clone())

        base = inner.weight
        probe = torch.zeros(1, base.shape[1], dtype=base.dtype, device=base.device)
        handle = inner.register_forward_hook(grab)
        try:
            layer.router(probe)
        finally:
            handle.remove()
        if len(seen) != 1:
            raise RuntimeError(f"layer {layer.index}: the router's own module ran {len(seen)} times for one call")
        found[layer.index] = _checked_weight(layer, seen[0])
    return found


def _as_norms(layer: int, value: torch.Tensor) -> torch.Tensor:
    value = torch.as_tensor(value).detach()
    if value.dim() == 2:
        return _row_norms(value)
    if value.dim() == 1:
        return value.double().cpu()
    raise ValueError(f"layer {layer}: expected router row norms [E] or a router weight [E, H], "
                     f"got shape {tuple(value.shape)}")


def weight_delta(before: Mapping[int, torch.Tensor], after: Mapping[int, torch.Tensor], signed: bool = False, *,
                 limits: Mapping[int, RoutingLimits] | None = None, model: nn.Module | None = None,
                 rtol: float = 1e-12) -> ExpertScores:
    """Router weight delta per layer (Eq. 4; ``signed=True``: Eq. 3), as [`ExpertScores`][].

    ``before``: ``{layer: norms [E]}`` of the original router ([`router_row_norms`][]);
    ``after``: ``{layer: norms [E] or weights [E, H]}`` of the adapted router (adapter merged).
    Importance = the score (smallest pruned first); ``raw`` holds the same values. Routing limits
    come from ``limits`` or from ``model`` (either one is required).

    Raises [`VacuousScoreError`][] when no router row norm moved by more than ``rtol`` times the
    largest norm: the router was not trained, and ``score="logit"`` is the score to use.
    """
    limits = _limits(limits, model)
    if limits is None:
        raise ValueError("weight_delta needs the layers' routing limits: pass limits= or model=")
    if set(before) != set(after):
        raise ValueError(f"before and after cover different layers: {listed(sorted(before))} vs "
                         f"{listed(sorted(after))}")
    deltas: dict[int, torch.Tensor] = {}
    for layer in sorted(before):
        n0, n1 = _as_norms(layer, before[layer]), _as_norms(layer, after[layer])
        if n0.shape != n1.shape:
            raise ValueError(f"layer {layer}: {n0.numel()} router rows before, {n1.numel()} after")
        deltas[layer] = n1 - n0
    largest_norm = max(float(_as_norms(l, v).max()) for l, v in before.items())
    largest_delta = max(float(d.abs().max()) for d in deltas.values())
    if largest_delta <= rtol * largest_norm:
        raise VacuousScoreError(
            f"the router weight delta is vacuous: no router row norm changed (largest |delta| {largest_delta:.3g}), "
            "so the router was not trained (a frozen router: IA3, Houlsby, or LoRA off the router). "
            "Use the logit delta (score='logit') instead")
    scores = deltas if signed else {l: d.abs() for l, d in deltas.items()}
    return ExpertScores(scores, limits, criterion=f"router_delta:{'signed_weight' if signed else 'weight'}",
                        raw=scores)


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, mode in modes:
            m.train(mode)


@torch.no_grad()
def router_logits(model: nn.Module, batch: Mapping[str, Any]) -> dict[int, torch.Tensor]:
    """``{layer: tensor[N, E]}``: the family's router logits for the N non-padding tokens of ``batch``.

    One forward of ``model`` (adapters active as they are; eval mode, restored afterwards) with a
    forward hook on every MoE layer's innermost router module: the hidden states entering it and
    the weight it routes with give ``layer.family.router_logits``. Hooks are removed on exit.
    Padding is where ``attention_mask`` [B, S] is 0 (all tokens count without one); ``labels``
    are not passed to the model.
    """
    layers = _layers(model)
    captured: dict[int, list[torch.Tensor]] = {layer.index: [] for layer in layers}
    handles = []

    def hook_for(layer: MoELayer):
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            hidden = args[0] if args else None
            if not isinstance(hidden, torch.Tensor):
                raise RuntimeError(f"layer {layer.index}: the router was called without a hidden-states tensor")
            logits = layer.family.router_logits(replace(layer, router=module), hidden)
            captured[layer.index].append(logits.detach())
        return hook

    inputs = model_inputs(batch)
    try:
        for layer in layers:
            handles.append(innermost_router(layer.router).register_forward_hook(hook_for(layer)))
        with _eval_mode(model):
            model(**inputs, **head_skipped(model))  # the router logits are all it needs
    finally:
        for handle in handles:
            handle.remove()

    mask = batch.get("attention_mask")
    out: dict[int, torch.Tensor] = {}
    for layer in layers:
        calls = captured[layer.index]
        if len(calls) != 1:
            raise RuntimeError(f"layer {layer.index}: the router ran {len(calls)} times in one forward, expected once")
        logits = calls[0].reshape(-1, calls[0].shape[-1])[:, :layer.num_experts]  # identity experts' columns dropped
        if mask is not None:
            keep = torch.as_tensor(mask).reshape(-1).to(logits.device).bool()
            if keep.numel() != logits.shape[0]:
                raise ValueError(f"layer {layer.index}: the router saw {logits.shape[0]} tokens but attention_mask "
                                 f"has {keep.numel()} positions")
            logits = logits[keep]
        out[layer.index] = logits
    return out


def logit_delta(base: Mapping[int, torch.Tensor], adapted: Mapping[int, torch.Tensor], *,
                limits: Mapping[int, RoutingLimits] | None = None, model: nn.Module | None = None,
                ) -> dict[int, torch.Tensor]:
    """Router logit delta per layer (Eq. 5): ``||L_adapt[:, e] - L_base[:, e]||_2 / sqrt(N)``, float64.

    ``base`` and ``adapted`` are [`router_logits`][] of the same tokens without and with the
    adapter. Returns [`ExpertScores`][] (importance = score) when ``limits`` or ``model`` is
    given, a plain ``{layer: tensor[E]}`` otherwise. Raises [`VacuousScoreError`][] when no
    logit moved (the adapter changes nothing the router sees).
    """
    if set(base) != set(adapted):
        raise ValueError(f"base and adapted logits cover different layers: {listed(sorted(base))} vs "
                         f"{listed(sorted(adapted))}")
    scores: dict[int, torch.Tensor] = {}
    for layer in sorted(base):
        l0, l1 = base[layer], adapted[layer]
        if l0.shape != l1.shape or l0.dim() != 2 or l0.shape[0] == 0:
            raise ValueError(f"layer {layer}: base logits {tuple(l0.shape)} and adapted logits {tuple(l1.shape)} "
                             "must both be [N, E] over the same N > 0 tokens")
        diff = l1.detach().double().cpu() - l0.detach().double().cpu()
        scores[layer] = torch.linalg.vector_norm(diff, 2, dim=0) / math.sqrt(diff.shape[0])
    if all(float(s.abs().max()) == 0.0 for s in scores.values()):
        raise VacuousScoreError("the router logit delta is vacuous: the adapter changes no router logit on the "
                                "held-out tokens (an untrained or disabled adapter)")
    limits = _limits(limits, model)
    if limits is None:
        return scores
    return ExpertScores(scores, limits, criterion="router_delta:logit", raw=scores)

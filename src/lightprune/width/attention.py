"""MWOP path attention: per-head removal of attention paths, and the Taylor gates on them.

MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), section 3: the attention of query
head h in layer l splits into paths b = (query modality -> key modality) in ``PATHS`` = (V2V, T2V, T2T); SYSTEM
tokens (and every other pair) are never pruned. With the keep mask K[b, h, i, j] (False where path(i, j) is
pruned for head h):

- mask mode (appendix D.5): the pruned keys are removed BEFORE the softmax,
  ``A = softmax(q k^T * s + mask, keys restricted to allowed(i, j) and K[h, i, j])``, so every query
  normalises over its retained causal keys. A query whose every allowed key the plan removes (a VISION
  query with V2V pruned and no SYSTEM key before it) outputs zeros: its attention update is empty.
- gate mode (appendix A.1, Taylor importance): the output is ``O = (A * C) V`` with
  ``C[b, h, i, j] = g[b, h, path(i, j)]`` on the prunable pairs and 1 elsewhere, so
  ``dL/dg[b, h, p] = <O_(l,h,p), dL/dO_(l,h)>`` where ``O_p = (A * M_p) V`` is the path's additive
  contribution with the attention weights held fixed (no renormalisation: "we zero either contribution
  without renormalizing"). Since the gates are 1, the forward is the mask-mode output and the gate is an
  identity whose backward computes ``sum_(i,j in p) A_ij (dL/dO_i . v_j)`` (`lightprune.width.gates.path_gate`).

Heads are grouped by their keep flags (`head_groups`, at most 8 groups), and each group runs SDPA with
one [B, 1, Q, K] pair mask, so neither mode builds a [B, heads, Q, K] tensor.

The function is registered in transformers' ``AttentionInterface`` as ``"lightprune_path:<original>"``
(original = ``sdpa`` or ``eager``) through `attention_interface`; layers without a route, or whose
plan keeps every path (outside the Taylor pass), call the original unchanged. Token modalities come from
`ModalityState`, set by a forward pre-hook that `lightprune.width.mask` installs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from lightprune.observe.attention_interface import dense_mask, original_function, register_wrapper, wrappable
from lightprune.width.gates import HeadGroup, PathGateInputs, path_gate
from lightprune.width.kernels import path_sparse_attention
from lightprune.width.kernels.attention_cost import FALLBACK_BACKEND
from lightprune.width.paths import PATHS, path_keep, path_masks

__all__ = ["PATH_PREFIX", "WRAPPABLE", "ModalityState", "PathRoute", "register", "route", "unroute",
           "head_groups", "path_masks", "path_keep"]

PATH_PREFIX = "lightprune_path:"
#: implementations the path attention wraps (it calls torch's SDPA with a per-head mask, or computes gates)
WRAPPABLE = ("sdpa", "eager")

_ROUTES: dict[int, "PathRoute"] = {}  # id(attention module) -> its route


class ModalityState:
    """Token modality of the current forward: int8 [B, T] over every position the keys span (cache included)."""

    def __init__(self) -> None:
        self.modality: torch.Tensor | None = None

    def keys_and_queries(self, batch: int, q_len: int, k_len: int, where: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(key modality [B, K], query modality [B, Q]): the queries are the last Q positions."""
        mod = self.modality
        if mod is None:
            raise RuntimeError(f"{where}: no token modality recorded; the model must be called with input_ids "
                               f"while width masks are active")
        if mod.shape[0] != batch or mod.shape[1] != k_len or q_len > k_len:
            raise RuntimeError(f"{where}: the attention sees batch {batch}, {q_len} queries and {k_len} keys, but "
                               f"the forward's tokens are {tuple(mod.shape)} (a static or pre-filled cache is not "
                               f"supported)")
        return mod, mod[:, k_len - q_len:]


@dataclass(eq=False)
class PathRoute:
    """What the path attention does for one layer: ``keep`` bool [H, 3] (None = all kept) and, in gate
    mode, ``gate`` [B, H, 3] (set per batch by the Taylor pass; None = mask mode). ``backend`` (mask mode
    only): None builds the dense [B, H, Q, K] mask here; a backend name (``"sdpa"``, ``"span"``, ``"flex"``,
    ``"triton"``), or ``{device type: name}`` (the export's per-device choice; a device type it does not name runs
    ``"sdpa"``), calls [`lightprune.width.kernels.path_sparse_attention`][...kernels.path_sparse_attention] (the
    exported model's attention)."""

    layer: int
    state: ModalityState
    keep: torch.Tensor | None = None
    gate: torch.Tensor | None = None
    backend: str | dict[str, str] | None = None

    def __post_init__(self) -> None:
        # a layer that keeps every path runs the original implementation unchanged (mask mode)
        self.all_kept = self.keep is None or bool(self.keep.all())


def route(module: nn.Module, layer_route: PathRoute) -> None:
    if id(module) in _ROUTES:
        raise RuntimeError(f"attention of layer {layer_route.layer} already has width masks or gates")
    _ROUTES[id(module)] = layer_route


def unroute(module: nn.Module, layer_route: PathRoute) -> None:
    if _ROUTES.get(id(module)) is layer_route:
        del _ROUTES[id(module)]


def register(original: str) -> str:
    """Register the path attention wrapping ``original``; its name (for ``switch_attention``)."""
    if original.startswith(PATH_PREFIX):
        raise RuntimeError("width masks are already active on this model")
    if original not in WRAPPABLE:
        raise ValueError(f"width masking wraps attention implementation {list(WRAPPABLE)}, the language model "
                         f"uses {original!r} (available: {wrappable((PATH_PREFIX,))}); set "
                         f"attn_implementation='sdpa' or 'eager' on the language model")
    return register_wrapper(PATH_PREFIX, original, _make_attention)


def _make_attention(original: str) -> Callable:
    def path_attention(module, query, key, value, attention_mask, **kwargs):
        layer_route = _ROUTES.get(id(module))
        if layer_route is None or (layer_route.gate is None and layer_route.all_kept):
            return original_function(original, module)(module, query, key, value, attention_mask, **kwargs)
        return _routed(module, query, key, value, attention_mask, layer_route, kwargs)

    path_attention.__name__ = f"path_attention[{original}]"
    return path_attention


def _routed(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
            layer_route: PathRoute, kwargs: dict) -> tuple[torch.Tensor, None]:
    where = f"width masks, layer {layer_route.layer}"
    for name in ("softcap", "s_aux", "position_bias"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"{where}: attention with {name} is not supported by path masking")
    batch, heads, q_len, dim = query.shape
    k_len = key.shape[2]
    key_mod, query_mod = layer_route.state.keys_and_queries(batch, q_len, k_len, where)
    key_mod, query_mod = key_mod.to(query.device), query_mod.to(query.device)
    if layer_route.backend is not None and layer_route.gate is None:
        return _kernel(module, query, key, value, key_mod, layer_route, kwargs, where)
    if layer_route.keep is not None and tuple(layer_route.keep.shape) != (heads, 3):
        raise RuntimeError(f"{where}: keep mask {tuple(layer_route.keep.shape)} for {heads} heads")
    scaling = kwargs.get("scaling")
    dropout = float(kwargs.get("dropout", 0.0) or 0.0)
    if layer_route.gate is not None and dropout:
        raise NotImplementedError(f"{where}: Taylor gates need attention dropout 0 (the model is in train mode "
                                  f"with attention_dropout {dropout})")
    allowed, additive = dense_mask(module, attention_mask, batch, q_len, k_len, query.device, kwargs)
    groups = head_groups(layer_route.keep, heads, key.shape[1], allowed, path_masks(query_mod, key_mod))
    parts = [_group_attention(query, key, value, allowed, additive, group, scaling, dropout) for group in groups]
    if len(parts) == 1:
        out = parts[0]
    else:
        order = torch.cat([group.heads for group in groups]).argsort()
        out = torch.cat(parts, dim=1).index_select(1, order)
    if layer_route.gate is not None:
        gate = layer_route.gate
        if tuple(gate.shape) != (batch, heads, len(PATHS)):
            raise RuntimeError(f"{where}: path gates {tuple(gate.shape)}, expected {(batch, heads, len(PATHS))}")
        inputs = PathGateInputs(groups=groups, additive=additive, scale=dim ** -0.5 if scaling is None else scaling,
                                query_mod=query_mod, key_mod=key_mod)
        out = path_gate(out, gate, query, key, value, inputs)
    return out.transpose(1, 2).contiguous(), None


def head_groups(keep: torch.Tensor | None, heads: int, kv_heads: int, allowed: torch.Tensor,
                paths: torch.Tensor) -> list[HeadGroup]:
    """The heads grouped by their keep flags (``keep`` bool [H, 3], None = all kept), each with its pair mask
    ``allowed & (pair's path kept)`` [B, 1 | H_g, Q, K]: at most 8 distinct flag rows, so no [B, H, Q, K] mask
    unless the model's own mask is per head. ``allowed`` [B | 1, 1 | H, Q, K]; ``paths`` [3, B, Q, K]."""
    device = allowed.device
    per_kv = heads // kv_heads
    flags = torch.ones(heads, len(PATHS), dtype=torch.bool) if keep is None else keep.detach().bool().cpu()
    rows = {}
    for h, row in enumerate(flags.tolist()):
        rows.setdefault(tuple(row), []).append(h)
    groups = []
    for row, members in rows.items():
        index = torch.tensor(members, device=device)
        mask = allowed if allowed.shape[1] == 1 else allowed.index_select(1, index)
        if not all(row):
            pruned = torch.zeros(paths.shape[1:], dtype=torch.bool, device=device)
            for p, kept in enumerate(row):
                if not kept:
                    pruned |= paths[p]
            mask = mask & ~pruned[:, None]
        groups.append(HeadGroup(heads=index, kv_heads=index // per_kv, kept=mask,
                                has_keys=mask.any(dim=-1, keepdim=True)))
    return groups


def _group_attention(query, key, value, allowed, additive, group: HeadGroup, scaling, dropout: float) -> torch.Tensor:
    """[B, H_g, Q, Dv] SDPA of one head group over its kept pairs; a query the plan (not the model) left
    without keys is computed over the model's keys (finite gradients) and zeroed."""
    heads = query.shape[1]
    model = allowed if allowed.shape[1] == 1 else allowed.index_select(1, group.heads)
    emptied = model.any(dim=-1, keepdim=True) & ~group.has_keys
    run = group.kept | (emptied & model)
    if additive is None:
        mask = run
    else:
        add = additive if additive.shape[1] == 1 else additive.index_select(1, group.heads)
        low = torch.tensor(torch.finfo(query.dtype).min, dtype=query.dtype, device=query.device)
        mask = torch.where(run, add.to(query.dtype), low)
    if group.heads.numel() == heads:  # every head: the kv heads as they are (GQA in SDPA)
        q, gqa = query, key.shape[1] != heads
        k, v = key, value
    else:
        q, gqa = query.index_select(1, group.heads), False
        k, v = key.index_select(1, group.kv_heads), value.index_select(1, group.kv_heads)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling,
                                                           enable_gqa=gqa)
    return out.masked_fill(emptied, 0.0) if bool(emptied.any()) else out


def _kernel(module, query, key, value, key_mod, layer_route: PathRoute, kwargs: dict, where: str):
    """The exported model's attention: the kernel derives causality and padding from the token modality,
    so only a plain causal + padding mask is representable (no sliding window, no dropout)."""
    window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
    if window is not None:
        raise NotImplementedError(f"{where}: the {layer_route.backend!r} path-sparse attention supports causal + "
                                  f"padding masks only, this layer has sliding_window={window}")
    if float(kwargs.get("dropout", 0.0) or 0.0):
        raise NotImplementedError(f"{where}: the path-sparse attention kernels run without attention dropout")
    backend = layer_route.backend
    if not isinstance(backend, str):  # chosen per device type at export; another device runs masked SDPA
        backend = backend.get(query.device.type, FALLBACK_BACKEND)
    out = path_sparse_attention(query, key, value, key_mod, layer_route.keep, scale=kwargs.get("scaling"),
                                backend=backend)
    return out.transpose(1, 2).contiguous(), None

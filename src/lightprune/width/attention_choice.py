"""The path-sparse attention backend each layer of an MWOP export runs, chosen per device at export.

MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs", appendix D.5) exports kernels for faster
prefill. Which of masked SDPA, the span decomposition and FlexAttention is fastest depends on the layer's kept paths and
the prompt's modality spans, so the export asks `choose_attention` for
every layer that prunes a path, on a reference token layout (the verification probe's first sample unless given), for
each device type of `PROFILES`, and records the choice and every
candidate's estimate (`attention_choice`). Loading runs the recorded backend of the device the layer runs on
(`recorded_backends`); a device type the record does not name runs masked SDPA, which runs everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from lightprune.width.kernels import BACKENDS
from lightprune.width.kernels.attention_cost import (
    CANDIDATES,
    FALLBACK_BACKEND,
    PROFILES,
    KernelProfile,
    choose_attention,
    layout_runs,
    record_costs,
)
from lightprune.width.layers import find_width_layers, vision_token_ids
from lightprune.width.modality import token_modality
from lightprune.width.paths import MODALITY_NAMES
from lightprune.width.plan import WidthPlan

__all__ = ["FALLBACK_BACKEND", "RECORD_VERSION", "attention_choice", "probe_layout", "recorded_backends"]

RECORD_VERSION = 1


def probe_layout(model: nn.Module, probe: Mapping[str, Any]) -> list[tuple[str, int]]:
    """``[(modality, length), ...]``: the token layout of the first sample of ``probe`` (its ``input_ids`` and
    ``attention_mask``), as [`token_modality`][...token_modality] labels it."""
    ids = probe.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or not ids.numel():
        raise ValueError("the attention kernels are chosen on a token layout: the probe has no [B, T] input_ids, so "
                         "pass attention_layout=[(modality, length), ...]")
    mask = probe.get("attention_mask")
    codes = token_modality(ids[:1].cpu(), None if mask is None else mask[:1].cpu(), vision_token_ids(model))
    return [(MODALITY_NAMES[code], end - start) for start, end, code in layout_runs(codes[0].tolist())]


def attention_choice(model: nn.Module, plan: WidthPlan, layout: Sequence, *,
                     element_bytes: Mapping[str, int] | None = None,
                     profiles: Mapping[str, KernelProfile] | None = None) -> dict[str, Any]:
    """The record an export keeps: for each device type of `PROFILES` (``profiles`` replaces or adds some, e.g.
    `measure_profile` on the target GPU), the backend of every layer
    whose plan prunes a path and every candidate's estimated seconds on ``layout`` (`layout_runs`'s forms).

    ``element_bytes``: bytes per key/value element per device type (default: the model's dtype on a GPU; 4 on the
    CPU, where half precision is computed in fp32)."""
    table = {**PROFILES, **dict(profiles or {})}
    for name, profile in table.items():
        if not isinstance(profile, KernelProfile):
            raise TypeError(f"profiles[{name!r}] must be a KernelProfile, got {type(profile).__name__}")
    runs = [(MODALITY_NAMES[code], end - start) for start, end, code in layout_runs(layout)]
    dtype_bytes = next(model.parameters()).element_size()
    sizes = {device: 4 if device == "cpu" else dtype_bytes for device in table} | dict(element_bytes or {})
    layers = {layer.index: layer for layer in find_width_layers(model)}
    devices: dict[str, Any] = {}
    for device, profile in table.items():
        chosen, seconds = {}, {}
        for index in sorted(plan.attn_keep):
            keep = plan.attn_keep[index]
            if bool(keep.all()):
                continue  # the layer runs the model's own attention
            layer = layers[index]
            name, costs = choose_attention(runs, keep.bool(), kv_heads=layer.num_kv_heads, head_dim=layer.head_dim,
                                           element_bytes=sizes[device], device=profile)
            chosen[str(index)], seconds[str(index)] = name, record_costs(costs)
        devices[device] = {"backends": chosen, "seconds": seconds, "element_bytes": sizes[device],
                           "profile": profile.record()}
    return {"version": RECORD_VERSION, "candidates": list(CANDIDATES),
            "layout": [list(run) for run in runs], "devices": devices}


def recorded_backends(record: Mapping[str, Any], where: str = "the export") -> dict[int, dict[str, str]]:
    """``{layer: {device type: backend}}`` from an `attention_choice` record; a malformed record is refused,
    naming the entry."""
    if not isinstance(record, Mapping) or record.get("version") != RECORD_VERSION or \
            not isinstance(record.get("devices"), Mapping):
        raise ValueError(f"{where}: the attention kernel record must be a mapping of version {RECORD_VERSION} with "
                         f"'devices', got {record!r:.200}")
    out: dict[int, dict[str, str]] = {}
    for device, entry in record["devices"].items():
        backends = entry.get("backends") if isinstance(entry, Mapping) else None
        if not isinstance(backends, Mapping):
            raise ValueError(f"{where}: attention kernels for {device!r} hold no 'backends' mapping")
        for layer, backend in backends.items():
            if backend not in BACKENDS:
                raise ValueError(f"{where}: layer {layer} on {device!r} records attention backend {backend!r}, not one "
                                 f"of {list(BACKENDS)}")
            try:
                index = int(layer)
            except (TypeError, ValueError):
                raise ValueError(f"{where}: attention kernels for {device!r} name layer {layer!r}, "
                                 f"not an int") from None
            out.setdefault(index, {})[str(device)] = backend
    return out

"""WidthPlan: MWOP's keep masks (MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"),
section 3 and appendix A.1), the only thing passed from Taylor scoring to width surgery.

For every decoder layer l and query head h a keep flag per attention path b in `PATHS` (V2V,
T2V, T2T: query modality -> key modality), and for every dense-FFN channel c a keep flag per execution
modality mu in `MODALITIES` (a pruned (c, mu) skips channel c for tokens of modality mu). A layer
missing from ``attn_keep`` / ``ffn_keep`` is dense. The plan round-trips through JSON under a strict
schema, nothing coerced: layer keys plain decimal strings (ints when built in Python), mask entries
booleans or the integers 0 / 1 (never floats such as ``0.0`` or strings such as ``"1"``), ``num_heads`` and
``intermediate_size`` positive integers, ``metadata`` an object holding no NaN or infinity (JSON has neither) and no
string that is not UTF-8 text (a lone surrogate such as JSON's ``"\\ud800"``). Every
violation is a [`PlanError`][]
naming the file (when loaded from one), the key path and the value, e.g.
``width plan file '/x/width_plan.json': attn_keep['0'][1][2] must be a keep flag (booleans or 0/1), got 0.0``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lightprune.core.checks import check_utf8
from lightprune.core.errors import PlanError, listed
from lightprune.core.jsonio import check_finite, layer_items, read_parsed, show, strict_int, write_json
from lightprune.width.layers import find_width_layers
from lightprune.width.paths import MODALITIES, PATHS

__all__ = ["WidthPlan", "WIDTH_UNITS", "PATHS", "MODALITIES"]

#: the units :meth:`WidthPlan.pruned_fraction` counts
WIDTH_UNITS: tuple[str, ...] = PATHS + ("ffn_vision", "ffn_text")


def _bad_flag(value: Any, path: str = "") -> tuple[str, Any] | None:
    """(index path, entry) of the first entry of nested lists ``value`` that is not a boolean or 0/1."""
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _bad_flag(item, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    return None if isinstance(value, bool) or strict_int(value) in (0, 1) else (path, value)


def _bool_tensor(value: Any, shape: tuple[int, ...], what: str) -> torch.Tensor:
    """``value`` (tensor or nested lists of booleans / 0 / 1) as a CPU bool tensor of ``shape``."""
    if isinstance(value, torch.Tensor) or hasattr(value, "__array__"):
        tensor = value.detach().cpu() if isinstance(value, torch.Tensor) else torch.as_tensor(value)
        if tensor.dtype != torch.bool:
            if tensor.is_floating_point() or tensor.is_complex():
                raise PlanError(f"{what} must hold keep flags (booleans or 0/1), got a {tensor.dtype} tensor")
            bad = ((tensor != 0) & (tensor != 1)).nonzero()
            if len(bad):
                index = tuple(bad[0].tolist())
                raise PlanError(f"{what}{''.join(f'[{i}]' for i in index)} must be a keep flag (booleans or 0/1), "
                                f"got {tensor[index].item()}")
            tensor = tensor.bool()
    elif not isinstance(value, (list, tuple)):
        raise PlanError(f"{what} must be a list of keep flags (booleans or 0/1), got {show(value)}")
    else:
        try:  # fast path: nested lists of bools and ints only ever give a bool or an integer tensor
            tensor = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError, OverflowError) as err:
            tensor, error = None, err
        if tensor is None or tensor.dtype != torch.bool and (tensor.is_floating_point() or tensor.is_complex()
                                                             or not bool(((tensor == 0) | (tensor == 1)).all())):
            found = _bad_flag(value)
            if found is not None:
                raise PlanError(f"{what}{found[0]} must be a keep flag (booleans or 0/1), got {show(found[1])}")
            raise PlanError(f"{what} is not a regular nested list of keep flags (expected shape {shape}): "
                            f"{error if tensor is None else show(value)}")
        tensor = tensor.bool()
    if tuple(tensor.shape) != shape:
        raise PlanError(f"{what} has shape {tuple(tensor.shape)}, expected {shape}")
    return tensor.clone()


def _counts(value: Any, name: str, what: str) -> dict[int, int]:
    """{layer: positive int} from ``value``."""
    counts = {}
    for key, layer, n in layer_items(value, name, f"{{layer: {what}}}", PlanError):
        count = strict_int(n)
        if count is None or count < 1:
            raise PlanError(f"{name}[{key!r}] must be a positive integer ({what}), got {show(n)}")
        counts[layer] = count
    return counts


@dataclass(eq=False)
class WidthPlan:
    """MWOP keep masks: ``attn_keep[l]`` bool [num_heads[l], 3] (columns `PATHS`),
    ``ffn_keep[l]`` {"vision": bool [m_l], "text": bool [m_l]}; a layer missing from either is dense.

    ``num_heads`` records every decoder layer's query-head count and ``intermediate_size`` every
    dense FFN's channel count (MoE layers are absent from it), so a plan for another model, or FFN
    masks for an MoE layer, are caught by [`validate`][] before any surgery.
    """

    attn_keep: dict[int, torch.Tensor]
    ffn_keep: dict[int, dict[str, torch.Tensor]]
    num_heads: dict[int, int]
    intermediate_size: dict[int, int]
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.num_heads = _counts(self.num_heads, "num_heads", "the layer's query-head count")
        self.intermediate_size = _counts(self.intermediate_size, "intermediate_size", "the dense FFN's channel count")
        attn = {}
        attn_items = layer_items(self.attn_keep, "attn_keep", "{layer: [[V2V, T2V, T2T] flags per head]}", PlanError)
        ffn_items = layer_items(self.ffn_keep, "ffn_keep", "{layer: {vision: [flags], text: [flags]}}", PlanError)
        for key, layer, mask in attn_items:
            if layer not in self.num_heads:
                raise PlanError(f"attn_keep names layer {layer}, which has no head count in num_heads "
                                f"(layers {listed(sorted(self.num_heads))})")
            attn[layer] = _bool_tensor(mask, (self.num_heads[layer], len(PATHS)), f"attn_keep[{key!r}]")
        ffn = {}
        for key, layer, masks in ffn_items:
            if layer not in self.intermediate_size:
                raise PlanError(f"ffn_keep names layer {layer}, which has no dense FFN in intermediate_size "
                                f"(dense FFN layers {listed(sorted(self.intermediate_size))}; an MoE layer's FFN is "
                                "experts)")
            if not isinstance(masks, Mapping) or set(masks) != set(MODALITIES):
                got = listed(sorted(masks, key=str)) if isinstance(masks, Mapping) else show(masks)
                raise PlanError(f"ffn_keep[{key!r}] must have exactly the keys {list(MODALITIES)}, got {got}")
            m = self.intermediate_size[layer]
            ffn[layer] = {mu: _bool_tensor(masks[mu], (m,), f"ffn_keep[{key!r}][{mu!r}]") for mu in MODALITIES}
        self.attn_keep, self.ffn_keep = attn, ffn
        if not isinstance(self.metadata, dict):
            raise PlanError(f"metadata must be an object, got {show(self.metadata)}")
        check_finite({"metadata": self.metadata}, "width plan", PlanError)
        # its other strings are keys and names the schema checks
        check_utf8({"metadata": self.metadata}, "a width plan file (UTF-8 JSON)", PlanError)

    # ------------------------------------------------------------------ construction
    @classmethod
    def dense(cls, model) -> "WidthPlan":
        """Every head path and every dense-FFN channel kept, for every decoder layer of ``model``."""
        layers = find_width_layers(model)
        dense = [layer for layer in layers if layer.intermediate_size is not None]
        return cls(attn_keep={layer.index: torch.ones(layer.num_heads, len(PATHS), dtype=torch.bool)
                              for layer in layers},
                   ffn_keep={layer.index: {mu: torch.ones(layer.intermediate_size, dtype=torch.bool)
                                           for mu in MODALITIES} for layer in dense},
                   num_heads={layer.index: layer.num_heads for layer in layers},
                   intermediate_size={layer.index: layer.intermediate_size for layer in dense})

    def replace(self, attn_keep: dict | None = None, ffn_keep: dict | None = None) -> "WidthPlan":
        """A copy with the given layers' masks replaced; the other layers keep theirs.

        ``ffn_keep[l]`` may name one modality only: the other keeps this plan's mask (all True when the
        layer was dense), so stages can prune vision channels and text channels separately.
        """
        attn = {**self.attn_keep, **{int(k): v for k, v in (attn_keep or {}).items()}}
        ffn = {layer: dict(masks) for layer, masks in self.ffn_keep.items()}
        for layer, masks in (ffn_keep or {}).items():
            layer = int(layer)
            if not isinstance(masks, dict) or not masks or not set(masks) <= set(MODALITIES):
                got = listed(sorted(masks, key=str)) if isinstance(masks, dict) else type(masks).__name__
                raise PlanError(f"replace: ffn_keep[{layer}] must map some of {list(MODALITIES)} to masks, got {got}")
            if layer not in self.intermediate_size:
                raise PlanError(f"replace: ffn_keep names layer {layer}, which has no dense FFN "
                                f"(dense FFN layers {listed(sorted(self.intermediate_size))})")
            base = ffn.get(layer) or {mu: torch.ones(self.intermediate_size[layer], dtype=torch.bool)
                                      for mu in MODALITIES}
            ffn[layer] = {**base, **masks}
        return WidthPlan(attn, ffn, dict(self.num_heads), dict(self.intermediate_size), copy.deepcopy(self.metadata))

    # ------------------------------------------------------------------ views and checks
    def pruned_fraction(self, unit: str) -> float:
        """Fraction of ``unit`` (one of `WIDTH_UNITS`) set False over every layer of the model
        (head paths over all ``num_heads``, FFN channels over all dense ``intermediate_size``)."""
        if unit in PATHS:
            col = PATHS.index(unit)
            total = sum(self.num_heads.values())
            pruned = sum(int((~mask[:, col]).sum()) for mask in self.attn_keep.values())
        elif unit in ("ffn_vision", "ffn_text"):
            mu = unit[len("ffn_"):]
            total = sum(self.intermediate_size.values())
            pruned = sum(int((~masks[mu]).sum()) for masks in self.ffn_keep.values())
        else:
            raise ValueError(f"unknown width unit {unit!r}; choose one of {list(WIDTH_UNITS)}")
        return pruned / total if total else 0.0

    def validate(self, model) -> None:
        """Raise [`PlanError`][] unless this plan fits ``model``'s decoder layers (head and channel counts)."""
        layers = {layer.index: layer for layer in find_width_layers(model)}
        if set(layers) != set(self.num_heads):
            raise PlanError(f"plan records decoder layers {listed(sorted(self.num_heads))}, the model has layers "
                            f"{listed(sorted(layers))}: a plan for another model?")
        for index, layer in layers.items():
            if self.num_heads[index] != layer.num_heads:
                raise PlanError(f"plan layer {index} expects {self.num_heads[index]} attention heads, the model "
                                f"has {layer.num_heads}: a plan for another model?")
            if layer.intermediate_size is None:
                if index in self.ffn_keep:
                    raise PlanError(f"plan masks FFN channels of layer {index}, an MoE layer of the model (its FFN "
                                    f"is experts; MWOP masks dense FFN channels only)")
                if index in self.intermediate_size:
                    raise PlanError(f"plan records a dense FFN of {self.intermediate_size[index]} channels in "
                                    f"layer {index}, which is an MoE layer of the model")
            elif self.intermediate_size.get(index) != layer.intermediate_size:
                raise PlanError(f"plan layer {index} expects an FFN of {self.intermediate_size.get(index)} channels, "
                                f"the model has {layer.intermediate_size}: a plan for another model?")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WidthPlan):
            return NotImplemented
        return (self.num_heads == other.num_heads and self.intermediate_size == other.intermediate_size
                and self.metadata == other.metadata
                and self.attn_keep.keys() == other.attn_keep.keys()
                and all(torch.equal(m, other.attn_keep[l]) for l, m in self.attn_keep.items())
                and self.ffn_keep.keys() == other.ffn_keep.keys()
                and all(torch.equal(masks[mu], other.ffn_keep[l][mu])
                        for l, masks in self.ffn_keep.items() for mu in MODALITIES))

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: masks as nested lists of 0/1, layer keys as strings, ``paths`` records the columns."""
        return {"paths": list(PATHS),
                "attn_keep": {str(l): m.int().tolist() for l, m in self.attn_keep.items()},
                "ffn_keep": {str(l): {mu: masks[mu].int().tolist() for mu in MODALITIES}
                             for l, masks in self.ffn_keep.items()},
                "num_heads": {str(l): n for l, n in self.num_heads.items()},
                "intermediate_size": {str(l): m for l, m in self.intermediate_size.items()},
                "metadata": self.metadata}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "WidthPlan":
        """The plan ``data`` describes ([`to_dict`][]'s form); any break of the schema is a [`PlanError`][]."""
        if not isinstance(data, Mapping):
            raise PlanError(f"width plan must be an object {{attn_keep: ..., ffn_keep: ..., ...}}, got {show(data)}")
        known = {"paths", "attn_keep", "ffn_keep", "num_heads", "intermediate_size", "metadata"}
        unknown = sorted(set(data) - known, key=str)
        if unknown:
            raise PlanError(f"unknown width plan keys {listed(unknown)}; known: {sorted(known)}")
        check_finite(data, "width plan", PlanError)
        for key in ("attn_keep", "ffn_keep", "num_heads", "intermediate_size"):
            if key not in data:
                raise PlanError(f"width plan is missing {key!r}")
        paths = data.get("paths", list(PATHS))
        if not isinstance(paths, (list, tuple)) or tuple(paths) != PATHS:
            raise PlanError(f"width plan columns (paths) are {show(paths)}, this lightprune reads {list(PATHS)}")
        metadata = data.get("metadata", {})
        if not isinstance(metadata, dict):
            raise PlanError(f"metadata must be an object, got {show(metadata)}")
        return cls(attn_keep=data["attn_keep"], ffn_keep=data["ffn_keep"], num_heads=data["num_heads"],
                   intermediate_size=data["intermediate_size"], metadata=dict(metadata))

    def save(self, path: str | os.PathLike) -> Path:
        return write_json(self.to_dict(), path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "WidthPlan":
        """The width plan saved at ``path``; a [`PlanError`][] names the file."""
        return read_parsed(path, "width plan", PlanError, cls.from_dict)

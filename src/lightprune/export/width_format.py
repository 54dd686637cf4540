"""The MWOP width-export format (MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"),
appendix D.5): file names, the manifest, and the kernel swap [`lightprune.export.load_pruned`][..load.load_pruned]
applies when a checkpoint holds ``width_plan.json``.

The manifest's file name is the one every export writes (`lightprune.export.result.MANIFEST_FILE`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from lightprune.core.jsonio import read_json
from lightprune.export.result import MANIFEST_FILE, WIDTH_FORMAT
from lightprune.width.kernels import BACKENDS, check_backend
from lightprune.width.kernels.attention_cost import FALLBACK_BACKEND
from lightprune.width.plan import WidthPlan
from lightprune.width.swap import swap_compact_ffn

__all__ = ["ATTENTION_RECORD", "WIDTH_PLAN_FILE", "WIDTH_FORMAT", "attach_width_kernels", "read_width_manifest"]

WIDTH_PLAN_FILE = "width_plan.json"
#: the manifest's entry with the attention backend chosen per layer and device type
#: (:func:`lightprune.width.attention_choice.attention_choice`)
ATTENTION_RECORD = "attention_kernels"


def attach_width_kernels(model: nn.Module, plan: WidthPlan, align: int = 64,
                         attention_backend: str | Mapping = "sdpa"):
    """Swap the path-sparse attention and the compact FFNs into ``model`` (in place); the handle is returned
    and kept as ``model.lightprune_width``.

    ``attention_backend``: one backend for every layer, or per layer ``{layer: {device type: backend}}`` (an export's
    choice, `recorded_backends`): the backends of the device the model is
    on are checked here, the layer runs the one of the device its attention runs on."""
    device = next(model.parameters()).device
    if isinstance(attention_backend, str):
        check_backend(attention_backend, device)
    elif isinstance(attention_backend, Mapping):  # an unknown name is refused by the swap, naming its layer
        for per_device in attention_backend.values():
            name = per_device.get(device.type, FALLBACK_BACKEND) if isinstance(per_device, Mapping) else per_device
            if name in BACKENDS:
                check_backend(name, device)
    handle = swap_compact_ffn(model, plan, align, mask_attention=True, attention_backend=attention_backend)
    model.lightprune_width = handle
    return handle


def read_width_manifest(path: Path) -> dict[str, Any]:
    """The width export's manifest (alignment) at ``path``; defaults when a plan was dropped in by hand."""
    manifest = path / MANIFEST_FILE
    if not os.path.lexists(manifest):
        return {"align": 64}
    data = read_json(manifest, "width manifest")  # a name there that is no readable JSON file: said, never skipped
    if data.get("format") != WIDTH_FORMAT:
        raise ValueError(f"{path} has {WIDTH_PLAN_FILE} but its manifest is of format {data.get('format')!r}, "
                         f"not {WIDTH_FORMAT!r}")
    return data


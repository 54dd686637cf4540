"""The MWOP width-export format (paper 002, appendix D.5): file names, the manifest, and the kernel swap
:func:`lightprune.export.load_pruned` applies when a checkpoint holds ``width_plan.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from lightprune.width.kernels import check_backend
from lightprune.width.plan import WidthPlan
from lightprune.width.swap import swap_compact_ffn

__all__ = ["WIDTH_PLAN_FILE", "WIDTH_FORMAT", "MANIFEST_NAME", "attach_width_kernels", "read_width_manifest"]

WIDTH_PLAN_FILE = "width_plan.json"
WIDTH_FORMAT = "lightprune-width-export"
MANIFEST_NAME = "lightprune_export.json"


def attach_width_kernels(model: nn.Module, plan: WidthPlan, align: int = 64, attention_backend: str = "sdpa"):
    """Swap the path-sparse attention and the compact FFNs into ``model`` (in place); the handle is returned
    and kept as ``model.lightprune_width``."""
    device = next(model.parameters()).device
    check_backend(attention_backend, device)
    handle = swap_compact_ffn(model, plan, align, mask_attention=True, attention_backend=attention_backend)
    model.lightprune_width = handle
    return handle


def read_width_manifest(path: Path) -> dict[str, Any]:
    """The width export's manifest (alignment) at ``path``; defaults when a plan was dropped in by hand."""
    manifest = path / MANIFEST_NAME
    if not manifest.is_file():
        return {"align": 64}
    data = json.loads(manifest.read_text())
    if data.get("format") != WIDTH_FORMAT:
        raise ValueError(f"{path} has {WIDTH_PLAN_FILE} but its manifest is of format {data.get('format')!r}, "
                         f"not {WIDTH_FORMAT!r}")
    return data

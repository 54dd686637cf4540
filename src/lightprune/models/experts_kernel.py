"""Experts that transformers' default ``grouped_mm`` implementation cannot run, switched to ``eager``:
`grouped_mm_runs`, `runnable_experts`.

transformers 5 runs a fused experts module through torch's grouped matmul (``experts_implementation="grouped_mm"``,
its default) without checking what the kernel takes: float32, bfloat16 or float16 operands whose rows are a multiple
of 16 bytes. A float64 model fails there with "Expected mat_a to be Float32, BFloat16 or Float16 matrix, got Double",
a bfloat16 expert of width 12 with "strides should be multiple of 16 bytes". Where a layer's experts are such,
`runnable_experts` points their config at transformers' ``"eager"`` implementation (one matmul per expert: any
dtype and width, the same outputs), as transformers itself falls back to ``"eager"`` where ``grouped_mm`` cannot
dispatch at all; any other implementation (``"batched_mm"``, lightprune's observing one) is left as it is.
[`lightprune.models.find_moe_layers`][..find_moe_layers] runs it on every model lightprune examines (a model in memory,
every checkpoint it builds), and calibration's own grouped matmul makes the same choice (`grouped_mm_runs`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

__all__ = ["GROUPED_MM_DTYPES", "grouped_mm_runs", "runnable_experts"]

#: the dtypes torch's grouped matmul has kernels for
GROUPED_MM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_PROJECTIONS = ("gate_up_proj", "up_proj", "down_proj")


def grouped_mm_runs(experts: nn.Module) -> bool:
    """True when torch's grouped matmul runs every projection of the fused ``experts`` ([E, out, in] or transposed):
    a dtype of `GROUPED_MM_DTYPES` and both matrix dimensions a multiple of 16 bytes."""
    for name in _PROJECTIONS:
        weight = getattr(experts, name, None)
        if not isinstance(weight, torch.Tensor):
            continue
        shape = getattr(weight, "ds_shape", None) or weight.shape  # a ZeRO-3 partition: its full shape
        if len(shape) != 3:
            continue
        if weight.dtype not in GROUPED_MM_DTYPES or any(d * weight.element_size() % 16 for d in shape[1:]):
            return False
    return True


def runnable_experts(modules: Iterable[nn.Module]) -> None:
    """Point each of the fused experts ``modules`` (others are skipped: a whole model's ``modules()`` may be given)
    that dispatches to ``"grouped_mm"`` but that it cannot run (`grouped_mm_runs`) at ``"eager"``: on its
    config, which the experts module reads at each call (a config shared by several layers switches them all)."""
    for module in modules:
        config = getattr(module, "config", None)
        if getattr(config, "_experts_implementation_internal", None) == "grouped_mm" and \
                not grouped_mm_runs(module):
            config._experts_implementation_internal = "eager"

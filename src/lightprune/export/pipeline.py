"""Plan -> verified checkpoint in one call: :func:`export_pruned`.

The reference for verification is the *masked* model (``with mask_experts(model, plan)``),
computed before any surgery, so the exported checkpoint is checked against what the plan means,
not against the pruned model it was written from: a bug in structural removal, in saving or in
loading all show up as a logits difference.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from torch import nn

from lightprune.experts.mask import mask_experts
from lightprune.experts.plan import ExpertPlan
from lightprune.experts.prune import prune_experts
from lightprune.export.save import MANIFEST_FILE, parameter_count, save_pruned
from lightprune.export.staging import check_out_dir
from lightprune.export.verify import ExportVerificationError, default_atol, default_probe, max_abs_diff, model_logits

__all__ = ["export_pruned"]


def export_pruned(model: nn.Module, plan: ExpertPlan, out_dir: str | os.PathLike, *,
                  probe: Mapping[str, Any] | None = None, overwrite: bool = False, atol: float | None = None,
                  processor: Any = None) -> dict[str, Any]:
    """Prune ``model`` in place by ``plan``, save it to ``out_dir`` and verify it against the masked model.

    Returns a report: ``out_dir``, ``params_before``, ``params_after``, ``checkpoint_bytes``
    (safetensors bytes on disk), ``expected_bytes`` (bytes of the pruned tensors),
    ``kept_per_layer`` ({layer: count}), ``uniform``, ``max_abs_diff`` and ``seconds``.

    The output directory is checked before any surgery. The pruned model is compared with the
    masked one before anything is written (a surgery problem), then the reloaded checkpoint
    (a save / load problem); either mismatch raises :class:`ExportVerificationError`, leaving
    ``out_dir`` untouched and the in-memory model pruned.
    """
    start = time.perf_counter()
    check_out_dir(out_dir, overwrite)
    probe = dict(probe) if probe is not None else default_probe(model)
    params_before = parameter_count(model)
    with mask_experts(model, plan):
        reference = model_logits(model, probe)
    prune_experts(model, plan)
    atol = default_atol(model) if atol is None else float(atol)
    gap = max_abs_diff(model_logits(model, probe), reference, what="pruned model")
    if gap > atol:
        raise ExportVerificationError(
            f"the pruned model's logits differ from the masked model's by up to {gap:.3g} > atol={atol:g}; "
            "nothing was written (the in-memory model is pruned). In bf16/fp16 a near tie between router "
            "scores can flip an expert choice: pass a larger atol or export in fp32", gap, atol)
    path = save_pruned(model, out_dir, probe=probe, reference_logits=reference, atol=atol, overwrite=overwrite,
                       processor=processor)
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    return {
        "out_dir": str(path),
        "params_before": params_before,
        "params_after": manifest["parameters"],
        "checkpoint_bytes": manifest["weight_bytes"],
        "expected_bytes": manifest["parameter_bytes"],
        "kept_per_layer": {str(layer): len(ids) for layer, ids in plan.keep.items()},
        "uniform": manifest["uniform"],
        "max_abs_diff": manifest["verification"]["max_abs_diff"],
        "seconds": time.perf_counter() - start,
    }

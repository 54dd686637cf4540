"""Save and load an MWOP width-pruned checkpoint (MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for
Efficient MLLMs"), appendix D.5): [`save_width_pruned`][] (the format's names and the loader's kernel swap are
in `lightprune.export.width_format`).

MWOP keeps every weight (the plan removes attention paths and FFN channel executions, not parameters),
so the checkpoint is the model's own ``save_pretrained`` plus ``width_plan.json`` and a manifest
(``lightprune_export.json`` with ``"format": "lightprune-width-export"``, the FFN alignment and the
plan's pruned fractions, and the path-sparse attention backend chosen for each layer and device type on a reference
prompt layout, `lightprune.width.attention_choice`). [`lightprune.load_pruned`][..load.load_pruned] sees the plan and
swaps the export-time modules in (`attach_width_kernels`): the path-sparse attention on the recorded backends (or one
named at load: ``sdpa``, ``span``, ``flex``, ``triton``) and the compact modality FFN with the recorded alignment.
The swap handle is kept on the model as ``model.lightprune_width`` (``.remove()`` gives the dense model back).

Verification, as for expert exports: the reloaded model's logits on a probe batch (a multimodal batch
from the caller; the default text-only probe would exercise the T2T path only) equal the reference
logits of the masked model (``mask_width``) at every non-padding position (a padding query keeps no
key in the kernels and outputs zeros there; its logits are never used). A mismatch raises
[`ExportVerificationError`][] and leaves ``out_dir`` untouched.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from lightprune.checkpoints.staging import staging_dir
from lightprune.core.checks import check_positive_int
from lightprune.core.jsonio import json_text
from lightprune.core.notices import quiet_progress
from lightprune.export.result import MANIFEST_FILE, WidthExportResult
from lightprune.export.verification import Verification, mismatch, reloaded_logits
from lightprune.export.verify import model_logits
from lightprune.export.width_format import ATTENTION_RECORD, WIDTH_FORMAT, WIDTH_PLAN_FILE
from lightprune.width.attention_choice import FALLBACK_BACKEND, attention_choice, probe_layout
from lightprune.width.mask import mask_width
from lightprune.width.paths import MODALITIES, PATHS
from lightprune.width.plan import WidthPlan

__all__ = ["save_width_pruned"]


def _valid_positions(probe: Mapping[str, Any], logits: torch.Tensor) -> torch.Tensor:
    mask = probe.get("attention_mask")
    if mask is None:
        return torch.ones(logits.shape[:2], dtype=torch.bool)
    return mask.bool().cpu()


def _summary(plan: WidthPlan) -> dict[str, float]:
    units = list(PATHS) + ([f"ffn_{m}" for m in MODALITIES] if plan.intermediate_size else [])
    return {unit: plan.pruned_fraction(unit) for unit in units}


def save_width_pruned(model: nn.Module, plan: WidthPlan, out_dir: str | os.PathLike, *,
                      probe: Mapping[str, Any] | None = None, reference_logits: torch.Tensor | None = None,
                      atol: float | None = None, align: int = 64, overwrite: bool = False, processor: Any = None,
                      metadata: Mapping[str, Any] | None = None, attention_layout: Sequence | None = None,
                      attention_profiles: Mapping[str, Any] | None = None) -> WidthExportResult:
    """Write ``model`` (a transformers MLLM, no adapter, no active masks) with ``plan`` to ``out_dir``.

    Args:
        model: the model whose weights are saved (merge LoRA adapters first).
        plan: the WidthPlan the checkpoint runs with.
        probe: keyword batch for verification (give a multimodal one; default: a text-only probe).
        reference_logits: the logits the reloaded model must reproduce on ``probe`` (default: ``model``
            under ``mask_width(model, plan)``).
        atol: the absolute term of the tolerance ``atol + rtol * max|reference|`` (default 1e-5 fp32, 1e-2
            bf16/fp16; ``rtol``: `default_rtol`).
        align: the compact FFN's channel alignment b recorded for loading (paper: 64).
        overwrite: replace an existing non-empty ``out_dir`` once the new one is verified.
        processor: saved beside the weights when given.
        metadata: extra entries for the manifest (e.g. the search's ATR and FLOPs).
        attention_layout: the prompt layout the attention backend of each layer is chosen for, ``[(modality,
            length), ...]`` (e.g. ``[("system", 18), ("vision", 3215), ("text", 19)]``); default: the probe's first
            sample. The choice per layer and device type is recorded in the manifest (``attention_kernels``,
            `lightprune.width.attention_choice`) and run by [`load_pruned`][].
        attention_profiles: per device type, the `KernelProfile` the choice uses
            instead of the built-in estimates (e.g. ``{"cuda": measure_profile("cuda", torch.bfloat16)}`` on the GPU
            the model will serve on).

    Returns a [`WidthExportResult`][...result.WidthExportResult] (the manifest's facts as attributes;
    ``os.PathLike`` and ``str``: the absolute checkpoint path).
    """
    start = time.perf_counter()
    check_positive_int("align", align)
    if getattr(model, "lightprune_width", None) is not None:
        raise ValueError("save_width_pruned got a model with width kernels attached; save the plain model")
    plan.validate(model)
    verification = Verification(probe)
    probe = verification.probe_for(model)
    verification.restore_buffers(model)  # cast with .to(bf16): rotary inv_freq back in fp32, as the checkpoint reloads
    if reference_logits is None:
        with mask_width(model, plan):
            reference_logits = model_logits(model, probe)
    verification.check_atol(atol)  # NaN would switch verification off: refused
    valid = _valid_positions(probe, reference_logits)
    layout = probe_layout(model, probe) if attention_layout is None else attention_layout
    kernels = attention_choice(model, plan, layout, profiles=attention_profiles)
    device = next(model.parameters()).device
    with staging_dir(out_dir, overwrite) as tmp:
        with quiet_progress():  # lightprune's own save and reload: the result reports them
            model.save_pretrained(tmp)
            if processor is not None:
                processor.save_pretrained(tmp)
            plan.save(tmp / WIDTH_PLAN_FILE)
            # what the loader reads (alignment, kernel choice), so the reload verified is the one users get
            manifest = {"format": WIDTH_FORMAT, "format_version": 1, "align": int(align), ATTENTION_RECORD: kernels}
            (tmp / MANIFEST_FILE).write_text(json_text(manifest, indent=2) + "\n")
            logits = reloaded_logits(tmp, probe, device)
        diff = verification.compare(logits, reference_logits, model, "reloaded width checkpoint", valid=valid)
        if not diff.ok:
            raise mismatch(diff, f"reloaded width checkpoint: max |logit diff| {diff.describe()} against the masked "
                                 "model")
        ran = kernels["devices"].get(device.type, {}).get("backends", {})
        manifest = {"format": WIDTH_FORMAT, "format_version": 1, "model_type": model.config.model_type,
                    "align": int(align), "pruned_fractions": _summary(plan),
                    "dtype": str(next(model.parameters()).dtype).removeprefix("torch."), ATTENTION_RECORD: kernels,
                    "verification": {**diff.record(), "attention_backend": "auto", "device": str(device),
                                     "attention_backends": {str(layer): ran.get(str(layer), FALLBACK_BACKEND)
                                                            for layer in sorted(plan.attn_keep)
                                                            if not bool(plan.attn_keep[layer].all())},
                                     "probe_shapes": {k: list(v.shape) for k, v in probe.items()
                                                      if isinstance(v, torch.Tensor)}},
                    **dict(metadata or {})}
        (tmp / MANIFEST_FILE).write_text(json_text(manifest, indent=2) + "\n")  # standard JSON: no NaN, no Infinity
    return WidthExportResult.from_manifest(out_dir, manifest, time.perf_counter() - start)

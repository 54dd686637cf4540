"""Save a structurally pruned model as a verified safetensors checkpoint: :func:`save_pruned`.

Steps, all inside a staging directory renamed into place only at the end (:mod:`.staging`):

1. ``save_pretrained`` (safetensors, transformers' on-disk per-expert layout), and the
   processor / tokenizer when one is given;
2. config.json: ``architectures`` names the stock transformers class; for a non-uniform model
   (``config.lightprune_experts_per_layer``) the generated ``modeling_lightprune.py`` and an
   ``auto_map`` entry are added (:mod:`.remote_code`), for a uniform one both are absent;
3. verification: reload through :func:`load_pruned` (and, non-uniform, also through
   transformers' ``trust_remote_code=True``), run the probe batch, compare with the reference
   logits (:mod:`.verify`); a mismatch raises :class:`ExportVerificationError`;
4. ``lightprune_export.json``: per-layer expert counts, parameter count and bytes, bytes on
   disk, dtype, the verification result.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightprune.experts.mask import is_masked
from lightprune.export.classes import auto_class_name, base_class
from lightprune.export.load import load_pruned, weight_files
from lightprune.export.remote_code import MODELING_FILE, auto_map_entry, modeling_source
from lightprune.export.staging import TMP_TAG, staging_dir
from lightprune.export.verify import ExportVerificationError, default_atol, default_probe, max_abs_diff, model_logits
from lightprune.models import find_moe_layers, get_family

__all__ = ["save_pruned", "parameter_count", "tensor_bytes", "MANIFEST_FILE"]

MANIFEST_FILE = "lightprune_export.json"
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def parameter_count(model: nn.Module) -> int:
    """Number of parameters (tied parameters counted once)."""
    return sum(p.numel() for p in model.parameters())


def tensor_bytes(model: nn.Module) -> int:
    """Bytes of what a checkpoint stores: parameters and persistent buffers, each tensor once."""
    tensors: dict[int, torch.Tensor] = {id(p): p for p in model.parameters()}
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None and name not in module._non_persistent_buffers_set:
                tensors[id(buf)] = buf
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _weights_dtype(model: nn.Module) -> torch.dtype:
    dtype = getattr(model, "dtype", None)
    if isinstance(dtype, torch.dtype):
        return dtype
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def _device(model: nn.Module) -> torch.device:
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def _finish_config(tmp: Path, model: nn.Module, uniform: bool) -> None:
    path = tmp / "config.json"
    data = json.loads(path.read_text())
    data["architectures"] = [base_class(model).__name__]
    ours = MODELING_FILE[:-3] + "."
    auto_map = {k: v for k, v in (data.get("auto_map") or {}).items() if not str(v).split("--")[-1].startswith(ours)}
    if uniform:
        (tmp / MODELING_FILE).unlink(missing_ok=True)
    else:
        (tmp / MODELING_FILE).write_text(modeling_source(model))
        auto_map.update(auto_map_entry(model))
    if auto_map:
        data["auto_map"] = auto_map
    else:
        data.pop("auto_map", None)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _check_no_pickles(tmp: Path) -> None:
    pickles = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.suffix in _PICKLE_SUFFIXES)
    if pickles:
        raise RuntimeError(f"export wrote pickle files {pickles}; lightprune exports safetensors only")


def _forget_remote_module(checkpoint: Path) -> None:
    """Drop transformers' cached copy of a staged directory's remote code (its name is unique to this export)."""
    try:
        from transformers.dynamic_module_utils import (
            HF_MODULES_CACHE,
            TRANSFORMERS_DYNAMIC_MODULE_NAME,
            _sanitize_module_name,
        )
    except ImportError:
        return
    if TMP_TAG not in checkpoint.name:
        return
    name = _sanitize_module_name(checkpoint.name)
    shutil.rmtree(Path(HF_MODULES_CACHE) / TRANSFORMERS_DYNAMIC_MODULE_NAME / name, ignore_errors=True)
    prefix = f"{TRANSFORMERS_DYNAMIC_MODULE_NAME}.{name}"
    for module in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
        del sys.modules[module]


def _reload_logits(checkpoint: Path, probe: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                   trust_remote_code: bool) -> torch.Tensor:
    try:
        reloaded = load_pruned(checkpoint, dtype=dtype, trust_remote_code=trust_remote_code)
        if device.type != "cpu":
            reloaded.to(device)
        return model_logits(reloaded, probe)
    finally:
        reloaded = None
        gc.collect()
        if trust_remote_code:
            _forget_remote_module(checkpoint)


def _verify(checkpoint: Path, probe: Mapping[str, Any], reference: torch.Tensor, dtype: torch.dtype,
            device: torch.device, remote: bool, atol: float) -> dict[str, float]:
    loaders = {"load_pruned": False}
    if remote:
        loaders["trust_remote_code"] = True
    diffs: dict[str, float] = {}
    for what, trust in loaders.items():
        logits = _reload_logits(checkpoint, probe, dtype, device, trust)
        diffs[what] = max_abs_diff(logits, reference, what=f"checkpoint reloaded with {what}")
    worst = max(diffs, key=diffs.get)
    if diffs[worst] > atol:
        raise ExportVerificationError(
            f"checkpoint reloaded with {worst} gives logits that differ from the reference by up to "
            f"{diffs[worst]:.3g} > atol={atol:g} ({diffs}); nothing was written", diffs[worst], atol)
    return diffs


def save_pruned(model: nn.Module, out_dir: str | os.PathLike, *, probe: Mapping[str, Any] | None = None,
                reference_logits: torch.Tensor | None = None, atol: float | None = None, overwrite: bool = False,
                processor: Any = None, max_shard_size: int | str | None = None) -> Path:
    """Write ``model`` (already pruned in place) to ``out_dir`` as a verified safetensors checkpoint.

    Args:
        model: a transformers MoE model of a supported family (not inside ``mask_experts``).
        out_dir: the checkpoint directory; must not exist or be empty unless ``overwrite``.
        probe: keyword batch for the verification forward (default: :func:`default_probe`).
        reference_logits: the logits the reloaded checkpoint must reproduce on ``probe``
            (default: ``model``'s own).
        atol: largest allowed absolute logits difference (default 1e-5 fp32, 1e-2 bf16/fp16).
        overwrite: replace an existing non-empty ``out_dir`` (only once the new one is verified).
        processor: a tokenizer / processor saved into the checkpoint too (``save_pretrained``).
        max_shard_size: passed to ``save_pretrained`` (default: transformers' own).

    The reloaded copies run on ``model``'s device. Returns the absolute checkpoint path.
    Raises :class:`ExportVerificationError` (leaving ``out_dir`` untouched) on a mismatch.
    """
    if is_masked(model):
        raise ValueError("save_pruned got a model inside mask_experts: masking is not saved; "
                         "call prune_experts(model, plan) first (or use export_pruned)")
    family = get_family(model)
    counts = {layer.index: layer.num_experts for layer in find_moe_layers(model)}
    family.set_expert_counts(counts)
    uniform = len(set(counts.values())) == 1
    probe = dict(probe) if probe is not None else default_probe(model)
    if reference_logits is None:
        reference_logits = model_logits(model, probe)
    atol = default_atol(model) if atol is None else float(atol)
    dtype, device = _weights_dtype(model), _device(model)
    with staging_dir(out_dir, overwrite) as tmp:
        model.save_pretrained(tmp, **({} if max_shard_size is None else {"max_shard_size": max_shard_size}))
        if processor is not None:
            processor.save_pretrained(tmp)
        _finish_config(tmp, model, uniform)
        _check_no_pickles(tmp)
        diffs = _verify(tmp, probe, reference_logits, dtype, device, not uniform, atol)
        manifest = {
            "format": "lightprune-export",
            "format_version": 1,
            "model_type": model.config.model_type,
            "architecture": base_class(model).__name__,
            "auto_class": auto_class_name(model.config),
            "uniform": uniform,
            "experts_per_layer": {str(k): v for k, v in sorted(counts.items())},
            "routed_experts": sum(counts.values()),
            "parameters": parameter_count(model),
            "parameter_bytes": tensor_bytes(model),
            "weight_bytes": sum(f.stat().st_size for f in weight_files(tmp)),
            "dtype": str(dtype).removeprefix("torch."),
            "verification": {"max_abs_diff": max(diffs.values()), "atol": atol, "loaders": diffs,
                             "probe_shapes": {k: list(v.shape) for k, v in probe.items()
                                              if isinstance(v, torch.Tensor)}},
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return Path(out_dir).expanduser().absolute()

"""One export's verification, shared by the in-memory exports ([`save_pruned`][..save.save_pruned],
[`export_pruned`][..pipeline.export_pruned], [`save_width_pruned`][..width.save_width_pruned]) and the
streamed one ([`prune_checkpoint`][..streamed.prune_checkpoint]): `Verification`.

An export makes one `Verification` from its arguments and hands it down; each step runs once per export,
whichever function of the export reaches it first:

1. ``atol`` checked (`Verification.check_atol`, `check_atol`: NaN would switch
   verification off), before anything changes or is written;
2. the plan checked against the model's MoE layers by the export
   ([`check_layers`][lightprune.experts.plan.ExpertPlan.check_layers]); ``write_merged``, ``mask_experts`` and
   ``prune_experts`` are then given the checked layers and do not check it again;
3. the probe built (`Verification.probe_for`: the given batch, else
   [`default_probe`][..verify.default_probe]);
4. in memory, the buffers transformers keeps in fp32 recomputed in fp32 (`Verification.restore_buffers`,
   `restore_fp32_buffers`) before the reference logits are computed, as the checkpoint reloads them;
5. the reference checked finite (`check_reference_finite`), then every comparison by the rule of
   [`lightprune.export.verify`][..verify] (``max|got - ref| <= atol + rtol * max|ref|``: `Verification.tolerance`,
   `Verification.compare`), a mismatch raised as [`ExportVerificationError`][..verify.ExportVerificationError]
   (`mismatch`).

The in-memory exports compare the reloaded checkpoint (`verify_reloaded`, `reloaded_logits`); the
streamed one runs both checkpoints layer by layer (`lightprune.export.streamed_verify`).
"""

from __future__ import annotations

import gc
import shutil
import sys
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightprune.checkpoints.staging_names import TMP_TAG
from lightprune.core.checks import check_atol
from lightprune.export.load import load_pruned
from lightprune.export.verify import (
    BROKEN_SOURCE,
    PROBE_SEED,
    PROBE_SHAPE,
    Comparison,
    ExportVerificationError,
    compare,
    default_atol,
    default_probe,
    default_rtol,
    model_logits,
    non_finite,
    restore_fp32_buffers,
)
from lightprune.models import find_moe_layers

__all__ = ["Verification", "mismatch", "reloaded_logits", "verify_reloaded", "non_finite_tensors",
           "check_reference_finite"]


class Verification:
    """The verification of one export (its steps: the module docstring); the probe is built, and the buffers restored,
    once however often they are asked for.

    ``probe``: the export's probe batch (None: [`default_probe`][...verify.default_probe], built on first use);
    ``atol``: the export's, once `check_atol` has checked it (None: the weights dtype's default,
    `default_atol`).
    """

    def __init__(self, probe: Mapping[str, Any] | None = None) -> None:
        self.probe = dict(probe) if probe is not None else None
        self.atol: float | None = None
        self._restored = False

    def check_atol(self, atol: float | None) -> Verification:
        """Check the export's ``atol`` (a positive finite number or None; each export gives it once); returns
        ``self``."""
        self.atol = check_atol(atol)
        return self

    def probe_for(self, model: nn.Module, shape: tuple[int, int] = PROBE_SHAPE,
                  seed: int = PROBE_SEED) -> dict[str, Any]:
        """The probe batch: the given one, else ``default_probe(model, shape, seed)``, built once."""
        if self.probe is None:
            self.probe = default_probe(model, shape=shape, seed=seed)
        return self.probe

    def restore_buffers(self, model: nn.Module) -> None:
        """Once: the buffers a cast with ``.to(bf16)`` left low back in fp32 (rotary ``inv_freq``), as the checkpoint
        reloads them (`restore_fp32_buffers`)."""
        if not self._restored:
            restore_fp32_buffers(model)
            self._restored = True

    def tolerance(self, model: nn.Module, layers: int | None = None) -> tuple[float, float]:
        """``(atol, rtol)`` for ``model``'s outputs over ``layers`` layers (default: all of them)."""
        return (default_atol(model) if self.atol is None else self.atol), default_rtol(model, layers)

    def compare(self, got: torch.Tensor, reference: torch.Tensor, model: nn.Module, what: str,
                layers: int | None = None, valid: torch.Tensor | None = None) -> Comparison:
        """``got`` against ``reference`` within `tolerance` (`compare`)."""
        return compare(got, reference, *self.tolerance(model, layers), what=what, valid=valid)


def mismatch(found: Comparison, message: str) -> ExportVerificationError:
    """The [`ExportVerificationError`][...verify.ExportVerificationError] of a failed comparison: ``message``, the
    difference, ``atol`` and the tolerance applied."""
    return ExportVerificationError(message, found.max_abs_diff, found.atol, tolerance=found.tolerance)


def non_finite_tensors(model: nn.Module, expert_ids: Mapping[int, Sequence[int]] | None = None) -> list[str]:
    """Each tensor a checkpoint of ``model`` stores (parameters, persistent buffers) that holds a NaN or inf, as
    ``"<name> (expert <i>) holds 1 NaN (first at [0, 3])"`` (a fused experts tensor: its first such expert, ``i``
    its position there, or ``expert_ids[layer][position]`` for a layer in ``expert_ids``: the ids a plan kept)."""
    try:
        experts = {id(layer.experts): layer for layer in find_moe_layers(model)}
    except ValueError:  # not a supported family: each tensor named whole
        experts = {}
    found = []
    for owner_name, owner in model.named_modules():
        tensors = {**owner._parameters, **{k: v for k, v in owner._buffers.items()
                                           if k not in owner._non_persistent_buffers_set}}
        for key, tensor in tensors.items():
            if tensor is None or non_finite(tensor) is None:
                continue
            name = f"{owner_name}.{key}" if owner_name else key
            layer = experts.get(id(owner))
            if layer is not None and tensor.dim() >= 2 and tensor.shape[0] == layer.num_experts:
                position = int((~torch.isfinite(tensor.float())).flatten(1).any(1).nonzero()[0])
                expert = (expert_ids or {}).get(layer.index, range(layer.num_experts))[position]
                found.append(f"{name} (expert {expert}) holds {non_finite(tensor[position])}")
            else:
                found.append(f"{name} holds {non_finite(tensor)}")
    return found


def check_reference_finite(model: nn.Module, reference: torch.Tensor, where: str, when: str,
                           after: str = "nothing was written") -> None:
    """Refuse NaN or inf reference logits, the model's own on the verification probe (``when``: how they were
    computed; ``after``: what became of the model and the output, for the message), naming the model's non-finite
    tensors when it has some: the model is broken, not the export."""
    found = non_finite(reference)
    if found is None:
        return
    tensors = non_finite_tensors(model)
    more = f" (and {len(tensors) - 1} more)" if len(tensors) > 1 else ""
    cause = f"its tensor {tensors[0]}{more}" if tensors else "its weights are finite"
    raise ExportVerificationError(f"{where}: the model's own logits on the verification probe ({when}) hold "
                                  f"{found}, {cause}: {BROKEN_SOURCE}; {after}")


# ------------------------------------------------------------------------------- the reloaded checkpoint
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


def reloaded_logits(checkpoint: Path, probe: Mapping[str, Any], device: torch.device, *,
                    dtype: torch.dtype | None = None, trust_remote_code: bool = False) -> torch.Tensor:
    """The logits on ``probe`` of the checkpoint at ``checkpoint`` reloaded ([`load_pruned`][...load.load_pruned],
    in ``dtype`` when given) onto ``device``; the reloaded model is freed before this returns (and transformers'
    copy of the staged directory's remote code dropped), so the next reload does not hold two."""
    alive = None
    try:
        reloaded = load_pruned(checkpoint, dtype=dtype, trust_remote_code=trust_remote_code)
        alive = weakref.ref(reloaded)
        if device.type != "cpu":
            reloaded.to(device)
        return model_logits(reloaded, probe)
    finally:
        reloaded = None
        if alive is not None and alive() is not None:  # held by a reference cycle: free it before the next load
            gc.collect()
        if trust_remote_code:
            _forget_remote_module(checkpoint)


def verify_reloaded(checkpoint: Path, verification: Verification, model: nn.Module, reference: torch.Tensor,
                    dtype: torch.dtype, device: torch.device, remote: bool) -> dict[str, Comparison]:
    """Reload ``checkpoint`` (written from ``model``) through [`load_pruned`][...load.load_pruned], and, ``remote``
    (a non-uniform export), through transformers' ``trust_remote_code=True`` too; each one's logits on the probe
    compared with ``reference`` (`Verification.compare`). Returns {loader: its comparison}; the worst failing
    one is raised (`mismatch`)."""
    loaders = {"load_pruned": False}
    if remote:
        loaders["trust_remote_code"] = True
    atol, rtol = verification.tolerance(model)
    diffs: dict[str, Comparison] = {}
    for what, trust in loaders.items():
        logits = reloaded_logits(checkpoint, verification.probe_for(model), device, dtype=dtype,
                                 trust_remote_code=trust)
        diffs[what] = compare(logits, reference, atol, rtol, what=f"checkpoint reloaded with {what}")
    worst = max(diffs, key=lambda what: diffs[what].max_abs_diff)
    if not diffs[worst].ok:
        each = {k: v.max_abs_diff for k, v in diffs.items()}
        raise mismatch(diffs[worst], f"checkpoint reloaded with {worst} gives logits that differ from the reference "
                                     f"by up to {diffs[worst].describe()} ({each}); nothing was written")
    return diffs

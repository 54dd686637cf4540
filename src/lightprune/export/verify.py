"""Verification of an exported checkpoint: a probe batch, logits, and the comparison.

Every export reloads what it wrote and runs a probe batch through it; the logits must match the
reference (the masked model's logits for [`export_pruned`][], else the in-memory model's) to
within a tolerance relative to the reference's magnitude (`compare`), or [`ExportVerificationError`][]
is raised with the largest absolute difference.

The rule, over the compared positions: ``max|got - ref| <= atol + rtol * max|ref|``. The error of a rounded
reduction scales with the magnitude of its terms, not with the entry it produces (an entry near zero by
cancellation carries the same absolute error as a large one), so the scale is the reference's largest magnitude,
not each entry's own (a per-element rule would refuse such entries). Defaults (`default_atol`,
`default_rtol`), with ``u`` the unit roundoff (eps / 2) of the weights' dtype, at least fp32's (what is
compared is fp32), ``u32`` fp32's (matmuls of fp32 and of half dtypes accumulate in fp32), ``K`` the longest
reduction (the widest input of a weight matrix) and ``L`` the layers the difference builds up over::

    rtol = sqrt(L) * (2 * u + 8 * u32 * sqrt(K))
    atol = 1e-5 (fp32 / fp64), 1e-2 (bf16 / fp16): the floor for a reference near zero

``2 u``: one unit in the last place at the reference's magnitude (a stored value rounded the other way);
``u32 sqrt(K)``: the rounding error of a length-K sum as a random walk, relative to the magnitude of its terms,
times 8 for two independently rounded runs and the largest of all compared entries; ``sqrt(L)``: independent
per-layer errors add as a random walk. A wrong or swapped expert changes outputs by a sizeable fraction of their
magnitude, far above this. A given ``atol`` replaces the default absolute term; the relative one still applies.

The default probe is a fixed-seed batch of 2 x 16 token ids drawn from the vocabulary without
any special or multimodal token id of the config (pad/bos/eos, image/video tokens, vision
start/end markers, ...), with an all-ones attention mask, so it runs through text-only and
multimodal families alike.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn

from lightprune.core.errors import register_error

__all__ = ["ExportVerificationError", "default_probe"]

T = TypeVar("T")
U32 = torch.finfo(torch.float32).eps / 2  # fp32's unit roundoff

PROBE_SHAPE = (2, 16)
PROBE_SEED = 0


@register_error
class ExportVerificationError(RuntimeError):
    """The reloaded checkpoint's logits differ from the reference beyond the tolerance
    (``atol + rtol * max|reference|``, `compare`)."""

    def __init__(self, message: str, max_abs_diff: float | None = None, atol: float | None = None,
                 tolerance: float | None = None):
        super().__init__(message)
        self.max_abs_diff = max_abs_diff
        self.atol = atol
        self.tolerance = tolerance


def _configs(config: Any) -> list[Any]:
    found = [config]
    for name in ("text_config", "vision_config"):
        sub = getattr(config, name, None)
        if sub is not None and sub is not config:
            found.append(sub)
    return found


def special_token_ids(config: Any) -> set[int]:
    """Every ``*_token_id`` / ``*_token_index`` / ``*_token_ids`` value of the config and its sub-configs."""
    ids: set[int] = set()
    for cfg in _configs(config):
        for key, value in vars(cfg).items():
            if not (key.endswith("_token_id") or key.endswith("_token_index") or key.endswith("_token_ids")):
                continue
            for v in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(v, int) and not isinstance(v, bool):
                    ids.add(v)
    return ids


def default_probe(model: nn.Module, shape: tuple[int, int] = PROBE_SHAPE,
                  seed: int = PROBE_SEED) -> dict[str, torch.Tensor]:
    """``{"input_ids", "attention_mask"}`` of ``shape``, seeded, without special token ids."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = int(getattr(text, "vocab_size", 0) or getattr(config, "vocab_size", 0) or 0)
    if vocab <= 0:
        raise ValueError(f"{type(model).__name__}: the config has no vocab_size to draw a probe from; pass probe=")
    allowed = torch.tensor(sorted(set(range(vocab)) - special_token_ids(config)), dtype=torch.long)
    if allowed.numel() == 0:
        raise ValueError("every token id of the vocabulary is a special token id; pass probe=")
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, allowed.numel(), shape, generator=gen)
    input_ids = allowed[picks]
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}


def _device(model: nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


@torch.no_grad()
def model_logits(model: nn.Module, probe: Mapping[str, Any], device: torch.device | str | None = None) -> torch.Tensor:
    """``model``'s logits on ``probe`` in eval mode (its mode restored after), fp32, on the CPU; the probe goes to
    ``device`` (default: that of the model's first parameter)."""
    device = _device(model) if device is None else device
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in probe.items()}
    batch.setdefault("use_cache", False)
    training = model.training
    model.eval()
    try:
        output = model(**batch)
    finally:
        model.train(training)
    logits = output.logits if hasattr(output, "logits") else output[0]
    return logits.detach().float().cpu()


def _compared(logits: torch.Tensor, reference: torch.Tensor, what: str,
              valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(|logits - reference|, reference)`` at the compared positions (see `max_abs_diff`)."""
    reference = reference.detach().float().cpu()
    if logits.shape != reference.shape:
        raise ExportVerificationError(f"{what}: logits of shape {tuple(logits.shape)} do not match the reference "
                                      f"of shape {tuple(reference.shape)}")
    diff = (logits.detach().float().cpu() - reference).abs()
    if valid is not None:
        if valid.dtype != torch.bool or tuple(valid.shape) != tuple(diff.shape[:valid.dim()]):
            raise ValueError(f"{what}: valid must be a boolean mask of the logits' leading dimensions "
                             f"{tuple(diff.shape[:max(valid.dim(), 1)])}, got {valid.dtype} {tuple(valid.shape)}")
        diff, reference = diff[valid.cpu()], reference[valid.cpu()]
    if diff.numel() and torch.isnan(diff).any():
        raise ExportVerificationError(f"{what}: NaN in the logits difference", float("nan"))
    return diff, reference


def max_abs_diff(logits: torch.Tensor, reference: torch.Tensor, what: str = "reloaded checkpoint",
                 valid: torch.Tensor | None = None) -> float:
    """Largest ``|logits - reference|``; a shape mismatch or a NaN is an [`ExportVerificationError`][].

    ``valid``: a boolean mask over the leading dimensions of the logits (``[batch, seq]``, e.g. the probe's
    attention mask): only those positions count (a padding query of the width kernels outputs zeros, which its
    reference need not), NaN included."""
    diff, _ = _compared(logits, reference, what, valid)
    return float(diff.max()) if diff.numel() else 0.0


@dataclass(frozen=True)
class Comparison:
    """One verification check: ``max_abs_diff`` (``max|got - ref|``) against ``atol + rtol * reference_max_abs``
    (``max|ref|``, over the same positions)."""

    max_abs_diff: float
    reference_max_abs: float
    atol: float
    rtol: float

    @property
    def tolerance(self) -> float:
        return self.atol + self.rtol * self.reference_max_abs

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    def record(self) -> dict[str, float]:
        """What was compared, for the manifest's ``verification`` entry."""
        return {"max_abs_diff": self.max_abs_diff, "reference_max_abs": self.reference_max_abs, "atol": self.atol,
                "rtol": self.rtol, "tolerance": self.tolerance}

    def describe(self) -> str:
        """``"<diff> > tolerance <t> (atol <a> + rtol <r> x max|reference| <m>)"``, for an error message."""
        return (f"{self.max_abs_diff:.3g} > tolerance {self.tolerance:.3g} (atol {self.atol:g} + rtol "
                f"{self.rtol:.3g} x max|reference| {self.reference_max_abs:.3g})")


def compare(got: torch.Tensor, reference: torch.Tensor, atol: float, rtol: float, what: str = "reloaded checkpoint",
            valid: torch.Tensor | None = None) -> Comparison:
    """``got`` against ``reference`` by the module docstring's rule (``valid`` as for `max_abs_diff`); a
    non-finite reference is an [`ExportVerificationError`][] (it would make any difference pass)."""
    diff, reference = _compared(got, reference, what, valid)
    if not diff.numel():
        return Comparison(0.0, 0.0, float(atol), float(rtol))
    scale = float(reference.abs().max())
    if not math.isfinite(scale):
        raise ExportVerificationError(f"{what}: the reference is not finite", float(diff.max()), atol)
    return Comparison(float(diff.max()), scale, float(atol), float(rtol))


#: elements checked finite at a time (:func:`non_finite`)
_FINITE_PIECE = 1 << 24
#: elements whose exponent bits are read at a time (a piece and its masked copy stay in the cache)
_BITS_PIECE = 1 << 22
#: per float dtype, the integer dtype of its bits and its exponent bits, all set only in an inf or a NaN
_EXPONENT_BITS = {torch.bfloat16: (torch.int16, 0x7F80), torch.float16: (torch.int16, 0x7C00),
                  torch.float32: (torch.int32, 0x7F800000), torch.float64: (torch.int64, 0x7FF0000000000000)}
#: what NaN or inf logits of the model an export starts from say about it
BROKEN_SOURCE = ("the model itself is broken, not the export (a config value such as rope_theta or rms_norm_eps, or "
                 "a NaN weight)")


def non_finite(tensor: torch.Tensor) -> str | None:
    """What ``tensor`` holds that is not finite (``"1 NaN (first at [1, 0, 0])"``), None when every value is finite
    or it is not floating point; one ``isfinite`` over it when it is finite."""
    if not tensor.is_floating_point() or tensor.numel() == 0 or tensor.device.type == "meta":
        return None
    if tensor.dtype == torch.float8_e4m3fn and int((tensor.view(torch.uint8) & 0x7F).amax()) != 0x7F:
        return None  # its only non-finite value is NaN, the bytes 0x7F and 0xFF: one reduction over the bytes
    if tensor.dtype in _EXPONENT_BITS:  # finite: no value has every exponent bit set (an integer reduction, no mask)
        bits, exponent = _EXPONENT_BITS[tensor.dtype]
        if all(int((piece & exponent).amax()) != exponent
               for piece in tensor.reshape(-1).view(bits).split(_BITS_PIECE)):
            return None
    wide = tensor.element_size() == 1  # fp8: no isfinite kernel; the values are exact in fp32
    # in pieces: the mask of a piece, not of a whole (large) tensor, is what this allocates
    if all(bool(torch.isfinite(piece.float() if wide else piece).all())
           for piece in tensor.reshape(-1).split(_FINITE_PIECE)):
        return None
    if wide:
        tensor = tensor.float()
    bad = ~torch.isfinite(tensor)
    nans = int(torch.isnan(tensor).sum())
    infs = int(bad.sum()) - nans
    counts = " and ".join(part for part in (f"{nans} NaN" if nans else "", f"{infs} inf" if infs else "") if part)
    first = [int(i) for i in bad.nonzero()[0].tolist()]
    return f"{counts} (first at {first})"


def check_written_finite(name: str, tensor: torch.Tensor, where: str) -> None:
    """Refuse a tensor an export would write with a NaN or inf in it, naming it (``name``: the tensor, with the
    expert it holds when it is one of a fused experts tensor; ``where``: the export, for the message)."""
    found = non_finite(tensor)
    if found is not None:
        raise ValueError(f"{where}: tensor {name} holds {found}: the export would carry it (a broken weight); "
                         "nothing was written; restore the weights, or prune the expert that holds it")


def _weights_dtype(model: nn.Module) -> torch.dtype:
    """The coarsest floating dtype of the parameters (fp32 without any)."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return max(dtypes, key=lambda d: torch.finfo(d).eps, default=torch.float32)


def default_atol(model: nn.Module) -> float:
    """1e-2 when the weights are bf16/fp16, else 1e-5: the absolute term (a reference near zero)."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return 1e-2 if dtypes & {torch.bfloat16, torch.float16} else 1e-5


def default_rtol(model: nn.Module, layers: int | None = None) -> float:
    """``sqrt(L) * (2 u + 8 u32 sqrt(K))`` (the module docstring): ``u`` of the coarsest weights dtype (at least
    fp32's), ``K`` the widest input of a weight matrix (last dimension of a >= 2-D floating parameter), ``L`` =
    ``layers`` (default: the text config's ``num_hidden_layers``; 1 for one layer's output)."""
    u = max(torch.finfo(_weights_dtype(model)).eps / 2, U32)
    widths = [p.shape[-1] for p in model.parameters() if p.is_floating_point() and p.dim() >= 2]
    k = max(widths, default=1)
    if layers is None:
        config = getattr(model, "config", None)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        layers = getattr(text, "num_hidden_layers", None) or 1
    return math.sqrt(max(int(layers), 1)) * (2 * u + 8 * U32 * math.sqrt(k))


# ------------------------------------------------------------------ buffers transformers keeps in fp32
def _transformers_models(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The outermost transformers models in ``module`` (itself included), by name."""
    from transformers import PreTrainedModel

    found: list[tuple[str, nn.Module]] = []
    for name, sub in module.named_modules():
        if isinstance(sub, PreTrainedModel) and not any(name.startswith(f"{p}.") or not p for p, _ in found):
            found.append((name, sub))
    return found


def _float_non_persistent(model: nn.Module) -> Iterator[tuple[str, nn.Module, str, torch.Tensor]]:
    """``(name, owner, key, buffer)`` of each non-persistent floating buffer."""
    for owner_name, owner in model.named_modules():
        for key in owner._non_persistent_buffers_set:
            buf = owner._buffers.get(key)
            if buf is not None and buf.is_floating_point():
                yield (f"{owner_name}.{key}" if owner_name else key), owner, key, buf


def fp32_buffer_names(model: nn.Module, dtype: torch.dtype) -> set[str]:
    """Names of the non-persistent floating buffers of ``model`` (a transformers model) that transformers keeps in
    fp32 in a model of ``dtype``: those fp32 in its class built from its config in ``dtype`` on the meta device, as
    ``from_pretrained(dtype=...)`` builds it (rotary ``inv_freq``, sinusoid position tables; not e.g. Gemma's
    ``embed_scale``, which follows ``dtype``). When that build fails: every ``*inv_freq`` buffer."""
    try:
        with torch.device("meta"):
            shadow = type(model)._from_config(copy.deepcopy(model.config), dtype=dtype)
    except Exception:  # noqa: BLE001 - a class that will not build from its config: the rotary buffers only
        return {name for name, *_ in _float_non_persistent(model) if name.endswith("inv_freq")}
    return {name for name, _, _, buf in _float_non_persistent(shadow) if buf.dtype == torch.float32}


def keep_fp32_buffers(module: nn.Module, cast: Callable[[], T]) -> T:
    """Run ``cast`` (a conversion of ``module``'s dtype: ``module.to(torch.bfloat16)``, Lightning's
    ``bf16-true`` precision plugin), then put back, with their fp32 values, the buffers of the transformers models
    in ``module`` that it converted and transformers keeps in fp32 (`fp32_buffer_names`); returns what
    ``cast`` returned. The model then holds what ``from_pretrained(dtype=...)`` gives."""
    before = [(prefix, model, name, owner, key, buf) for prefix, model in _transformers_models(module)
              for name, owner, key, buf in _float_non_persistent(model) if buf.dtype == torch.float32]
    result = cast()
    keep: dict[tuple[str, torch.dtype], set[str]] = {}
    for prefix, model, name, owner, key, buf in before:
        now = owner._buffers.get(key)
        if now is None or now is buf or not now.is_floating_point() or now.dtype == torch.float32:
            continue
        if (prefix, now.dtype) not in keep:
            keep[prefix, now.dtype] = fp32_buffer_names(model, now.dtype)
        if name in keep[prefix, now.dtype]:
            owner._buffers[key] = buf.to(device=now.device)
    return result


def _init_owner(model: nn.Module, name: str) -> nn.Module:
    """The innermost transformers model holding the module of buffer ``name`` (its ``_init_weights`` initialises
    it, as in ``from_pretrained``)."""
    from transformers import PreTrainedModel

    owner, best = model, ""
    for sub_name, sub in model.named_modules():
        inside = sub_name and name.startswith(f"{sub_name}.")
        if inside and isinstance(sub, PreTrainedModel) and len(sub_name) > len(best):
            owner, best = sub, sub_name
    return owner


@torch.no_grad()
def restore_fp32_buffers(model: nn.Module) -> list[str]:
    """Recompute in fp32 the buffers transformers keeps in fp32 (`fp32_buffer_names`) that a cast of
    ``model`` (``model.to(torch.bfloat16)``) left in a lower precision, as ``from_pretrained`` computes them (the
    ``_init_weights`` of the transformers model holding them, run on a copy of their module); a value that does
    not round to the one the model holds is left alone. Returns the names restored. The export path calls it
    before computing its reference: the checkpoint reloads with these buffers in fp32."""
    restored = []
    for prefix, hf in _transformers_models(model):
        low = [(name, owner, key, buf) for name, owner, key, buf in _float_non_persistent(hf)
               if buf.dtype != torch.float32]
        if not low:
            continue
        keep: dict[torch.dtype, set[str]] = {}
        for name, owner, key, buf in low:
            if buf.dtype not in keep:
                keep[buf.dtype] = fp32_buffer_names(hf, buf.dtype)
            if name not in keep[buf.dtype] or buf.device.type == "meta":
                continue
            try:
                twin = copy.deepcopy(owner)
                twin._buffers[key] = torch.full(buf.shape, math.nan, dtype=torch.float32, device=buf.device)
                _init_owner(hf, name)._init_weights(twin)
                value = twin._buffers[key]
            except Exception:  # noqa: BLE001 - not recomputable here: left as the cast left it
                continue
            if value is not None and value.dtype == torch.float32 and torch.equal(value.to(buf.dtype), buf):
                owner._buffers[key] = value
                restored.append(f"{prefix}.{name}" if prefix else name)
    return restored

"""Verification of an exported checkpoint: a probe batch, logits, and the comparison.

Every export reloads what it wrote and runs a probe batch through it; the logits must match the
reference (the masked model's logits for :func:`export_pruned`, else the in-memory model's) to
within ``atol`` (default 1e-5 for fp32/fp64 weights, 1e-2 for bf16/fp16), or
:class:`ExportVerificationError` is raised with the largest absolute difference.

The default probe is a fixed-seed batch of 2 x 16 token ids drawn from the vocabulary without
any special or multimodal token id of the config (pad/bos/eos, image/video tokens, vision
start/end markers, ...), with an all-ones attention mask, so it runs through text-only and
multimodal families alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from lightprune.core.errors import register_error

__all__ = ["ExportVerificationError", "default_probe", "special_token_ids", "model_logits", "max_abs_diff",
           "default_atol"]

PROBE_SHAPE = (2, 16)
PROBE_SEED = 0


@register_error
class ExportVerificationError(RuntimeError):
    """The reloaded checkpoint's logits differ from the reference beyond ``atol``."""

    def __init__(self, message: str, max_abs_diff: float | None = None, atol: float | None = None):
        super().__init__(message)
        self.max_abs_diff = max_abs_diff
        self.atol = atol


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


def default_probe(model: nn.Module, shape: tuple[int, int] = PROBE_SHAPE, seed: int = PROBE_SEED) -> dict[str, torch.Tensor]:
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


def max_abs_diff(logits: torch.Tensor, reference: torch.Tensor, what: str = "reloaded checkpoint",
                 valid: torch.Tensor | None = None) -> float:
    """Largest ``|logits - reference|``; a shape mismatch or a NaN is an :class:`ExportVerificationError`.

    ``valid``: a boolean mask over the leading dimensions of the logits (``[batch, seq]``, e.g. the probe's
    attention mask): only those positions count (a padding query of the width kernels outputs zeros, which its
    reference need not), NaN included."""
    reference = reference.detach().float().cpu()
    if logits.shape != reference.shape:
        raise ExportVerificationError(f"{what}: logits of shape {tuple(logits.shape)} do not match the reference "
                                      f"of shape {tuple(reference.shape)}")
    diff = (logits - reference).abs()
    if valid is not None:
        if valid.dtype != torch.bool or tuple(valid.shape) != tuple(diff.shape[:valid.dim()]):
            raise ValueError(f"{what}: valid must be a boolean mask of the logits' leading dimensions "
                             f"{tuple(diff.shape[:max(valid.dim(), 1)])}, got {valid.dtype} {tuple(valid.shape)}")
        diff = diff[valid.cpu()]
    if diff.numel() == 0:
        return 0.0
    if torch.isnan(diff).any():
        raise ExportVerificationError(f"{what}: NaN in the logits difference", float("nan"))
    return float(diff.max())


def default_atol(model: nn.Module) -> float:
    """1e-2 when the weights are bf16/fp16, else 1e-5."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return 1e-2 if dtypes & {torch.bfloat16, torch.float16} else 1e-5

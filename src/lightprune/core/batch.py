"""Which keys of a batch dict feed the model: one rule for every loop that calls ``model(**batch)``.

Datamodules put two kinds of non-input keys in batches: ``labels`` (the loss / answer positions, -100
elsewhere) and `SAMPLE_KEYS` that describe a sample (``task_ids``: the task family of each row,
for per-task retention). Neither may reach a transformers model: some models silently accept unknown
keyword arguments, so a stray key would not even fail loudly.
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping

import torch

__all__ = ["SAMPLE_KEYS", "model_inputs", "head_skipped"]

#: batch keys that describe a sample and are never model inputs
SAMPLE_KEYS: tuple[str, ...] = ("task_ids",)


def model_inputs(batch: Mapping[str, Any], *, keep_labels: bool = False,
                 device: torch.device | None = None) -> dict[str, Any]:
    """``batch`` without `SAMPLE_KEYS` (and without ``labels`` unless ``keep_labels``), tensors moved to
    ``device`` when given."""
    drop = SAMPLE_KEYS if keep_labels else SAMPLE_KEYS + ("labels",)
    return {k: (v.to(device) if device is not None and isinstance(v, torch.Tensor) else v)
            for k, v in batch.items() if k not in drop}


def head_skipped(model: torch.nn.Module) -> dict[str, int]:
    """``{"logits_to_keep": 1}`` when ``model``'s forward names that argument (transformers' causal LMs and MLLMs),
    else ``{}``: a pass that only observes the decoder layers then runs the output head on the last position, not
    on every one (the [batch, tokens, vocab] logits are the largest activation of a forward at a real vocabulary)."""
    forward = getattr(model, "forward", None)
    try:
        parameters = inspect.signature(forward).parameters if forward is not None else {}
    except (TypeError, ValueError):  # a forward without a signature: pass nothing it may not take
        return {}
    return {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}

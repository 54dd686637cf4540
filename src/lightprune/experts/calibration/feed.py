"""One batch fed to an observed calibration pass: the one driver of ``lp.collect_expert_stats`` and of
``lightprune calibrate``'s ExpertStats callback.

The batch's model inputs are prepared by the one rule of `lightprune.core.batch.model_inputs` (``labels`` and
the sample keys dropped: no loss is needed), the observer is told about the batch (its token subsets), and the
model runs it once with the output head skipped where the model allows (`lightprune.core.batch.head_skipped`:
the observed pass reads the decoder layers only, so neither a loss nor the [batch, tokens, vocab] logits are
computed). Both paths give the same statistics, to the bit, from the same batches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from lightprune.core.batch import model_inputs

__all__ = ["observe_batch"]


def observe_batch(observer: Any, model: nn.Module, batch: Mapping[str, Any], *, head: Mapping[str, Any],
                  device: torch.device | None = None, forward: Callable[..., Any] | None = None) -> None:
    """Feed ``batch`` to ``observer`` (an entered `ExpertObserver` of ``model``): its model inputs (moved to
    ``device`` when given) declared, then one forward under ``no_grad`` with ``head`` (`head_skipped` of ``model``,
    read once per pass by the caller: a signature look-up). ``forward``: what runs the inputs (default ``model``;
    the Lightning module, whose forward checks the token ids first)."""
    inputs = model_inputs(batch, device=device)
    observer.begin_batch(inputs)
    with torch.no_grad():
        (model if forward is None else forward)(**inputs, **head)

"""collect_expert_stats: one observed forward pass per batch -> every criterion for every subset.

    stats = lp.collect_expert_stats(model, batches, subsets=("all", "text"))
    stats.score("reap", "text")          # {layer: tensor[E_l]}, higher = keep
    stats = lp.collect_expert_stats("path/to/checkpoint", batches)   # one decoder layer in memory at a time

The work is `ExpertObserver`'s, each batch fed by `observe_batch`; a checkpoint directory goes through
`collect_checkpoint_stats`, whose statistics equal the in-memory pass's.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

import torch
from torch import nn

from lightprune.core.batch import head_skipped
from lightprune.experts.calibration.feed import observe_batch
from lightprune.experts.calibration.observer import ExpertObserver
from lightprune.experts.calibration.result import CalibrationStats
from lightprune.experts.calibration.sequential import collect_checkpoint_stats

__all__ = ["collect_expert_stats", "collect_model_stats"]


def collect_expert_stats(model: nn.Module | str | os.PathLike, batches: Iterable[Mapping[str, Any]],
                         subsets: Iterable[str] = ("all",), low_attn_quantile: float = 0.02,
                         criteria: Iterable[str] | None = None, progress: bool = True,
                         **streaming: Any) -> CalibrationStats:
    """``lp.collect_expert_stats``: a model in memory ([`collect_model_stats`][], where it is) or a checkpoint
    directory, one decoder layer in memory at a time (`collect_checkpoint_stats`; ``streaming``: its
    ``batches_per_pass``, ``device`` and ``activation_budget``)."""
    if isinstance(model, (str, os.PathLike)):
        return collect_checkpoint_stats(model, batches, subsets, low_attn_quantile, criteria, progress, **streaming)
    if streaming:
        raise TypeError(f"{sorted(streaming)} apply to a checkpoint directory, not to a model in memory")
    return collect_model_stats(model, batches, subsets, low_attn_quantile, criteria, progress)


def collect_model_stats(model: nn.Module, batches: Iterable[Mapping[str, Any]], subsets: Iterable[str] = ("all",),
                        low_attn_quantile: float = 0.02, criteria: Iterable[str] | None = None,
                        progress: bool = True) -> CalibrationStats:
    """One observed forward per batch; returns every criterion for every subset (AIMER ("AIMER: Calibration-Free
    Task-Agnostic MoE Pruning", arXiv 2603.18492), appendix B; MAEP ("Modality-Aware Expert Pruning for MoE-Based
    Multimodal Large Language Models", arXiv 2611.05927), Eqs. 2 and 8).

    ``criteria`` may also name the merging statistics (`MERGE_STATISTICS`: ``expert_outputs`` for HC-SMoE,
    ``router_logits`` for M-SMoE; ``frequency`` comes with them), read by [`CalibrationStats.merging_statistic`][].

    ``batches`` are dicts the model accepts as keyword arguments (``labels`` are dropped: no loss
    is needed). An empty iterable is an error.
    """
    observer = ExpertObserver(model, subsets, criteria, low_attn_quantile)
    device = next(model.parameters()).device
    iterator = batches
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(batches, desc="calibration", unit="batch", leave=False)
    head = head_skipped(model)  # neither a loss nor logits are needed to observe experts
    with observer, torch.no_grad():
        for batch in iterator:
            observe_batch(observer, model, batch, device=device, head=head)
    if observer.batches_seen == 0:
        raise ValueError("empty calibration set: no batches were given")
    return observer.result()

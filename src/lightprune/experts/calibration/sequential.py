"""Calibration statistics of a checkpoint directory with one decoder layer in memory: :func:`collect_checkpoint_stats`.

The same :class:`~lightprune.experts.calibration.ExpertObserver` as the in-memory pass (every criterion, every
token subset, the attention probe of ``vision_low_attn``) observes the checkpoint's meta skeleton while the batches
go through it layer by layer (:func:`lightprune.checkpoints.sequential.run_layer_outer`): each decoder layer is read from
the safetensors files once per pass of ``batches_per_pass`` batches, every batch runs it, and it is released. The
model's own forward runs for every batch, so the statistics are those of the in-memory pass (the same tensors, the
same order of operations). Memory: one decoder layer, what lies outside the layers (embeddings, head, a vision
tower) and the pass's activations at a layer boundary.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Mapping
from typing import Any

from tqdm.auto import tqdm

from lightprune.checkpoints.reader import Checkpoint
from lightprune.checkpoints.sequential import run_layer_outer
from lightprune.checkpoints.skeleton import Skeleton
from lightprune.core.batch import head_skipped, model_inputs
from lightprune.core.jsonio import strict_int
from lightprune.experts.calibration.observer import ExpertObserver
from lightprune.experts.calibration.result import CalibrationStats
from lightprune.models.layer import find_decoder_layers

__all__ = ["collect_checkpoint_stats"]


def collect_checkpoint_stats(path: str | os.PathLike, batches: Iterable[Mapping[str, Any]],
                             subsets: Iterable[str] = ("all",), low_attn_quantile: float = 0.02,
                             criteria: Iterable[str] | None = None, progress: bool = True,
                             batches_per_pass: int = 16) -> CalibrationStats:
    """Every calibration criterion for every subset of the checkpoint at ``path``, one decoder layer resident (see
    the module docstring); ``batches_per_pass`` bounds the activations held (each layer is read once per pass)."""
    count = strict_int(batches_per_pass)  # a Python or NumPy int, never a bool or a float
    if count is None or count < 1:
        raise ValueError(f"batches_per_pass must be an int >= 1, got {batches_per_pass!r}")
    batches_per_pass = count
    with Checkpoint(path) as checkpoint:
        skeleton = Skeleton(checkpoint)
        observer = ExpertObserver(skeleton.model, subsets, criteria, low_attn_quantile)
        layers = len(find_decoder_layers(skeleton.model)[1])
        bar = tqdm(desc=f"calibration, layer by layer ({checkpoint.path.name})", unit="layer-batch", leave=False,
                   disable=not progress)
        iterator = iter(batches)
        head = head_skipped(skeleton.model)  # no logits are needed
        try:
            with observer:
                while True:
                    wave = [model_inputs(b, device=skeleton.device) for b in itertools.islice(iterator, batches_per_pass)]
                    if not wave:
                        break
                    bar.total = (bar.total or 0) + layers * len(wave)
                    run_layer_outer(skeleton, wave, lambda batch: skeleton.model(**batch, **head),
                                    before=lambda i, layer: observer.begin_batch(wave[i], count=layer == 0),
                                    progress=bar)
        finally:
            bar.close()
        if observer.batches_seen == 0:
            raise ValueError("empty calibration set: no batches were given")
        return observer.result()

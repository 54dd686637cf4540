"""Calibration statistics of a checkpoint directory with one decoder layer in memory: `collect_checkpoint_stats`.

The same `ExpertObserver` as the in-memory pass (every criterion, every
token subset, the attention probe of ``vision_low_attn``) observes the checkpoint's meta skeleton while the batches
go through it layer by layer
([`lightprune.checkpoints.sequential.run_layer_outer`][lightprune.checkpoints.sequential.run_layer_outer]): each decoder
layer is read from
the safetensors files once per pass of ``batches_per_pass`` batches, every batch runs it, and it is released. The
model's own forward runs for every batch, so the statistics are those of the in-memory pass (the same tensors, the
same order of operations). Memory: one decoder layer, what lies outside the layers (embeddings, head, a vision
tower) and the pass's activations at a layer boundary.

``device``: where the layers are read to and computed (the CPU, or a GPU: pinned reads copied on a stream of their
own, the activations at a layer boundary on the GPU up to a budget,
[`lightprune.checkpoints.sequential`][lightprune.checkpoints.sequential]); the
sums stay there, and the pass reads nothing back from the device per layer or batch (its non-finite routing checks
are read once per pass).

Several processes: inside an initialised ``torch.distributed`` process group (``torchrun``), ``batches`` are this
rank's share; each rank runs its own passes, the ranks then agree that none failed, and each layer's float64 sums are
all-reduced once, so every rank returns the statistics of all ranks' tokens (the sum of each rank's sums: what one
process computes over the same shares, up to the order of float64 additions). Each rank reads every layer once per
pass through the same memory-mapped files: ranks on one node share the page cache, so a layer comes from the disk
once and the other ranks copy it from memory.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from tqdm.auto import tqdm

from lightprune.checkpoints.device import streaming_device
from lightprune.checkpoints.reader import Checkpoint
from lightprune.checkpoints.sequential import run_layer_outer
from lightprune.checkpoints.skeleton import Skeleton
from lightprune.core.batch import head_skipped, model_inputs
from lightprune.core.distributed import is_distributed, raise_on_every_rank, world_size
from lightprune.core.jsonio import strict_int
from lightprune.experts.calibration.observer import ExpertObserver
from lightprune.experts.calibration.result import CalibrationStats
from lightprune.models.layer import find_decoder_layers

__all__ = ["collect_checkpoint_stats"]


def collect_checkpoint_stats(path: str | os.PathLike, batches: Iterable[Mapping[str, Any]],
                             subsets: Iterable[str] = ("all",), low_attn_quantile: float = 0.02,
                             criteria: Iterable[str] | None = None, progress: bool = True,
                             batches_per_pass: int = 16, device: Any = "cpu",
                             activation_budget: int | None | str = "auto") -> CalibrationStats:
    """Every calibration criterion for every subset of the checkpoint at ``path``, one decoder layer resident on
    ``device`` (see the module docstring); ``batches_per_pass`` bounds the activations held (each layer is read once
    per pass), ``activation_budget`` how many bytes of them stay on the device
    ([`run_in_lockstep`][lightprune.checkpoints.sequential.run_in_lockstep]). Inside a ``torch.distributed`` process
    group ``batches`` are this rank's share and every rank returns the statistics of all ranks' batches."""
    count = strict_int(batches_per_pass)  # a Python or NumPy int, never a bool or a float
    if count is None or count < 1:
        raise ValueError(f"batches_per_pass must be an int >= 1, got {batches_per_pass!r}")
    batches_per_pass = count
    device = streaming_device(device)
    with Checkpoint(path) as checkpoint:
        skeleton = Skeleton(checkpoint, device=device)
        observer = ExpertObserver(skeleton.model, subsets, criteria, low_attn_quantile, device=device)
        layers = len(find_decoder_layers(skeleton.model)[1])
        bar = tqdm(desc=f"calibration, layer by layer ({checkpoint.path.name})", unit="layer-batch", leave=False,
                   disable=not progress)
        head = head_skipped(skeleton.model)  # no logits are needed
        activations: list[dict[str, Any]] = []

        def passes() -> None:
            iterator = iter(batches)
            while True:
                wave = [model_inputs(b, device=device) for b in itertools.islice(iterator, batches_per_pass)]
                if not wave:
                    break
                bar.total = (bar.total or 0) + layers * len(wave)
                activations.append(run_layer_outer(
                    skeleton, wave, lambda batch: skeleton.model(**batch, **head),
                    before=lambda i, layer: observer.begin_batch(wave[i], count=layer == 0, remember=True),
                    progress=bar,
                    activation_budget=activation_budget))
                observer.check_routing()  # the pass's one read of its checks

        try:
            with observer:
                start = time.perf_counter()
                raise_on_every_rank(passes)  # a rank that fails stops every rank before the sums
                reduced = time.perf_counter()
                observer.all_reduce()  # this rank's sums and every other's, each layer's once
                seconds = {"passes": reduced - start, "all_reduce": time.perf_counter() - reduced}
        finally:
            bar.close()
        if observer.batches_seen == 0:
            raise ValueError("empty calibration set: no batches were given"
                             + (" to any rank" if is_distributed() else ""))
        stats = observer.result()
        stats.metadata["device"] = str(device)
        stats.metadata["activations"] = _activations(activations)
        stats.metadata["seconds"] = seconds  # this rank's passes, and the ranks' agreement and sums after them
        if is_distributed():
            stats.metadata["ranks"] = world_size()
        return stats


def _activations(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The passes' [`BoundaryActivations`][lightprune.checkpoints.sequential.BoundaryActivations] reports as one: the
    budget, the most bytes held on the device at once, the moves to the host and their bytes."""
    return {"budget_bytes": reports[0]["budget_bytes"] if reports else None,
            "peak_bytes": max((r["peak_bytes"] for r in reports), default=0),
            "spills": sum(r["spills"] for r in reports), "spilled_bytes": sum(r["spilled_bytes"] for r in reports)}

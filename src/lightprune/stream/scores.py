"""Weight-only expert scores of a checkpoint directory without loading the model: :func:`score_weights`.

The model is a :class:`~lightprune.stream.skeleton.Skeleton` (meta device); each MoE block is read from the
safetensors files, scored by the criterion's own ``score_layer`` and released before the next one, so memory
holds one block (its router, experts and shared experts) at a time. The scores equal those of the loaded model
(the same tensors, the same code); ``random`` reads no tensor at all.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from torch import nn
from tqdm.auto import tqdm

from lightprune.experts.criteria import Criterion, score_weights as score_model_weights, weight_criterion
from lightprune.experts.scores import ExpertScores
from lightprune.models import MoELayer, find_moe_layers
from lightprune.stream.checkpoint import Checkpoint
from lightprune.stream.skeleton import Skeleton

__all__ = ["score_weights", "score_checkpoint"]


def score_weights(model: nn.Module | str | os.PathLike, criterion: str | type[Criterion] | Criterion = "aimer", *,
                  seed: int = 0, progress: bool = True, **kwargs: Any) -> ExpertScores:
    """``lp.score_weights``: a model (:func:`lightprune.experts.criteria.score_weights`) or a checkpoint directory
    (:func:`score_checkpoint`, one MoE block in memory at a time)."""
    if isinstance(model, (str, os.PathLike)):
        return score_checkpoint(model, criterion, seed=seed, progress=progress, **kwargs)
    return score_model_weights(model, criterion, seed=seed, **kwargs)


def score_checkpoint(path: str | os.PathLike, criterion: str | type[Criterion] | Criterion = "aimer", *,
                     seed: int = 0, progress: bool = True, **kwargs: Any) -> ExpertScores:
    """Score every routed expert of the checkpoint at ``path`` from its weights, one MoE block resident at a
    time (see the module docstring); ``criterion``, ``seed`` and ``kwargs`` as for
    :func:`lightprune.experts.criteria.score_weights`."""
    instance = weight_criterion(criterion, seed=seed, **kwargs)
    with Checkpoint(path) as checkpoint:
        skeleton = Skeleton(checkpoint)
        bar = tqdm(desc=f"scoring {instance.name or type(instance).__name__} from {checkpoint.path.name}",
                   total=len(find_moe_layers(skeleton.model)), unit="layer", leave=False, disable=not progress)

        @contextlib.contextmanager
        def resident(layer: MoELayer) -> Iterator[None]:
            with skeleton.resident(layer.name):
                yield
            bar.update(1)

        try:
            return instance.score(skeleton.model, layer_weights=resident)
        finally:
            bar.close()

"""Weight-only expert scores, of a model in memory or of a checkpoint directory: [`score_weights`][].

A checkpoint directory is scored without loading the model: its model is a
[`Skeleton`][lightprune.checkpoints.skeleton.Skeleton] (meta device); each MoE block is read from the safetensors
files, scored by the criterion's own ``score_layer`` and released before the next one, so memory holds one block
(its router, experts and shared experts) at a time, or only the modules the criterion reads
([`weight_modules`][..base.Criterion.weight_modules]: AIMER and magnitude the experts, router norm
the router), with the tensors the layer's routing reads (checked finite before it is scored, as in memory). The
scores equal those of the loaded model (the same tensors, the same code); ``random`` reads no tensor at all.
``device``: where the blocks are read to and scored (the CPU, or a GPU: `lightprune.checkpoints.device`).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn
from tqdm.auto import tqdm

from lightprune.checkpoints.device import streaming_device
from lightprune.checkpoints.pool import ReadPool
from lightprune.checkpoints.reader import Checkpoint
from lightprune.checkpoints.skeleton import Skeleton
from lightprune.experts.criteria.base import Criterion, CriterionNeedsDataError
from lightprune.experts.criteria.registry import get_criterion, get_criterion_class
from lightprune.experts.scores import ExpertScores
from lightprune.models import MoELayer, find_moe_layers

__all__ = ["score_weights", "score_model_weights", "score_checkpoint", "weight_criterion"]


def score_weights(model: nn.Module | str | os.PathLike, criterion: str | type[Criterion] | Criterion = "aimer", *,
                  seed: int = 0, progress: bool = True, device: Any = None, **kwargs: Any) -> ExpertScores:
    """``lp.score_weights``: a model in memory ([`score_model_weights`][], where it is) or a checkpoint directory
    ([`score_checkpoint`][], one MoE block in memory at a time, on ``device``: default the CPU)."""
    if isinstance(model, (str, os.PathLike)):
        return score_checkpoint(model, criterion, seed=seed, progress=progress, device=device or "cpu", **kwargs)
    if device is not None:
        raise TypeError("device applies to a checkpoint directory; a model in memory is scored where it is "
                        "(move it first: model.to(device))")
    return score_model_weights(model, criterion, seed=seed, **kwargs)


def weight_criterion(criterion: str | type[Criterion] | Criterion = "aimer", *, seed: int = 0,
                     **kwargs: Any) -> Criterion:
    """The weight-only criterion [`score_weights`][] scores with: a registered name (see
    [`available_criteria`][...registry.available_criteria]), a dotted import path, a [`Criterion`][] subclass or
    instance; ``kwargs`` go to
    its constructor, ``seed`` to criteria whose constructor takes one (``"random"``). A criterion that needs
    calibration data raises [`CriterionNeedsDataError`][]."""
    if isinstance(criterion, Criterion):
        return get_criterion(criterion, **kwargs)
    cls = get_criterion_class(criterion)
    if cls.needs_data:
        raise CriterionNeedsDataError(cls.name or cls.__name__)
    if "seed" in inspect.signature(cls).parameters:
        kwargs.setdefault("seed", seed)
    return get_criterion(cls, **kwargs)


def score_model_weights(model: nn.Module, criterion: str | type[Criterion] | Criterion = "aimer", *,
                        seed: int = 0, **kwargs: Any) -> ExpertScores:
    """Score every routed expert of ``model`` with a weight-only criterion (higher = keep).

    ``criterion`` is a registered name (see [`available_criteria`][...registry.available_criteria]), a dotted import
    path, a [`Criterion`][] subclass or instance; ``kwargs`` go to its constructor. ``seed`` is
    passed to criteria whose constructor takes one (``"random"``) and ignored by the others.
    A criterion that needs calibration data raises [`CriterionNeedsDataError`][].
    """
    return weight_criterion(criterion, seed=seed, **kwargs).score(model)


def weight_module_names(skeleton: Skeleton, criterion: Criterion) -> dict[int, list[str]]:
    """{MoE layer index: the names in ``skeleton.model`` of the modules of that layer ``criterion`` reads}
    ([`weight_modules`][...base.Criterion.weight_modules], default the whole MoE block)."""
    names = {module: name for name, module in skeleton.model.named_modules()}
    out = {}
    for layer in find_moe_layers(skeleton.model):
        modules = criterion.weight_modules(layer)
        out[layer.index] = [layer.name] if modules is None else [names[m] for m in modules]
    return out


def streamed_layer_weights(skeleton: Skeleton, criterion: Criterion) -> Callable[[MoELayer], Any]:
    """``layer -> context`` in which the modules of ``layer`` that ``criterion`` reads (`weight_module_names`)
    and the other tensors its routing reads (`MoEFamily.routing_tensors`, which [`Criterion.score`][] checks
    finite) are read in from ``skeleton``'s checkpoint, and released after: what [`Criterion.score`][] takes as
    ``layer_weights``. Once a layer is in, the next MoE layer's bytes are prefetched ([`Skeleton.prefetch`][]):
    the disk reads them while this one is scored."""
    names = weight_module_names(skeleton, criterion)
    following = dict(zip(list(names)[:-1], list(names)[1:]))

    def routing(layer: MoELayer) -> list[str]:
        """The layer's routing tensors outside the modules read in for the criterion."""
        heads = tuple(f"{name}." for name in names[layer.index])
        return [found.name for found in layer.family.routing_tensors(layer) if not found.name.startswith(heads)]

    @contextlib.contextmanager
    def resident(layer: MoELayer) -> Iterator[None]:
        with skeleton.resident(*names[layer.index]), skeleton.resident_tensors(*routing(layer)):
            if layer.index in following:
                skeleton.prefetch(names[following[layer.index]])
            yield
    return resident


def score_checkpoint(path: str | os.PathLike, criterion: str | type[Criterion] | Criterion = "aimer", *,
                     seed: int = 0, progress: bool = True, device: Any = "cpu", **kwargs: Any) -> ExpertScores:
    """Score every routed expert of the checkpoint at ``path`` from its weights, one MoE block resident at a
    time on ``device`` (see the module docstring); ``criterion``, ``seed`` and ``kwargs`` as for
    [`score_model_weights`][]."""
    device = streaming_device(device)  # before anything is read
    instance = weight_criterion(criterion, seed=seed, **kwargs)
    with Checkpoint(path) as checkpoint:
        # every layer's tensors read into the same memory; multi-token-prediction layers scored as any other
        skeleton = Skeleton(checkpoint, pool=ReadPool(), mtp=True, device=device)
        bar = tqdm(desc=f"scoring {instance.name or type(instance).__name__} from {checkpoint.path.name}",
                   total=len(find_moe_layers(skeleton.model)), unit="layer", leave=False, disable=not progress)

        weights = streamed_layer_weights(skeleton, instance)

        @contextlib.contextmanager
        def resident(layer: MoELayer) -> Iterator[None]:
            with weights(layer):
                yield
            bar.update(1)

        try:
            return instance.score(skeleton.model, layer_weights=resident)
        finally:
            bar.close()

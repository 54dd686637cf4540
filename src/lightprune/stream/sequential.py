"""A skeleton's model run with one decoder layer in memory at a time: :func:`layer_by_layer`.

Everything outside the decoder layers (embeddings, final norm, LM head, rotary tables, a vision tower) is loaded
once; each decoder layer is loaded by a forward pre-hook just before it runs and released by a forward hook just
after, so the model's own ``forward`` (masks, caches off, position embeddings) runs unchanged while memory holds
one layer's weights plus the activations. Inside the block, anything else that works on the model works:
``mask_experts``, the observing experts implementation of calibration.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import nn

from lightprune.models.base import find_decoder_layers
from lightprune.stream.skeleton import Skeleton

__all__ = ["layer_by_layer", "outside_modules"]


def outside_modules(model: nn.Module, layers_path: str) -> list[str]:
    """The names of the smallest set of modules that covers everything of ``model`` outside ``layers_path``."""
    found, module, prefix = [], model, ""
    for part in layers_path.split("."):
        found += [f"{prefix}{name}" for name, _ in module.named_children() if name != part]
        module, prefix = getattr(module, part), f"{prefix}{part}."
    return found


@contextlib.contextmanager
def layer_by_layer(skeleton: Skeleton, progress: Any = None) -> Iterator[nn.Module]:
    """Inside the block, ``skeleton.model`` runs layer by layer (see the module docstring); ``progress``: a tqdm
    bar advanced once per layer run."""
    model = skeleton.model
    path, layers = find_decoder_layers(model)
    outside = outside_modules(model, path)
    names = [f"{path}.{index}" for index in range(len(layers))]
    handles = []

    def before(name: str):
        def hook(module: nn.Module, args: Any, kwargs: Any = None) -> None:
            skeleton.load([name])
        return hook

    def after(name: str):
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            skeleton.release([name])
            if progress is not None:
                progress.update(1)
        return hook

    skeleton.load(outside)
    try:
        for name, layer in zip(names, layers, strict=True):
            handles.append(layer.register_forward_pre_hook(before(name)))
            handles.append(layer.register_forward_hook(after(name)))
        yield model
    finally:
        for handle in handles:
            handle.remove()
        skeleton.release(names)
        skeleton.release(outside)

"""A skeleton's model run with one decoder layer in memory at a time.

Everything outside the decoder layers (embeddings, final norm, LM head, rotary tables, a vision tower) is loaded
once, and the model's own ``forward`` runs unchanged (its masks, position embeddings, whatever it does between
layers, as Qwen3-VL's deepstack), so anything else that works on the model works too (``mask_experts``, the
observing experts implementation of calibration, the attention probe):

- :func:`layer_by_layer`: each decoder layer is loaded by a forward pre-hook just before it runs and released
  just after: one forward, every layer read once;
- :func:`run_layer_outer`: many batches, each layer read once for all of them (once per pass for a model that loops
  over some of its layers). Each batch's forward runs in its own thread and waits at every decoder layer; visit by
  visit, the layer is loaded, the batches run it one after the other (each up to its next layer), and it is
  released. Memory holds one layer plus every batch's activations at a layer boundary (what a layer-input cache
  holds), and only one forward computes at a time.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from lightprune.checkpoints.skeleton import Skeleton
from lightprune.models.base import find_decoder_layers

__all__ = ["layer_by_layer", "outside_modules", "run_layer_outer"]


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


class _Aborted(Exception):
    """Raised in a waiting forward when the run stops."""


def run_layer_outer(skeleton: Skeleton, inputs: Sequence[Any], forward: Callable[[Any], Any],
                    before: Callable[[int, int], None] | None = None, progress: Any = None) -> None:
    """Run ``forward(inputs[i])`` (a call of ``skeleton.model``) for every input, each decoder layer loaded once per
    visit (see the module docstring). ``before(i, layer)`` runs before input ``i`` enters decoder layer ``layer``;
    ``progress``: a tqdm bar advanced once per (layer visit, input). An error in a forward stops the run and is raised.

    The layers are visited in the order the forwards call them, which must be the same for every input: once each
    in order for most models; a model that loops over a span of its layers (Inkling 2 Loop runs layers 6-17 three
    times) visits that span once per pass, each visit reading its layer again."""
    model = skeleton.model
    path, layers = find_decoder_layers(model)
    names = [f"{path}.{index}" for index in range(len(layers))]
    cond, local, intra_op = threading.Condition(), threading.local(), torch.get_num_threads()
    inference = torch.is_inference_mode_enabled()
    # input -> ("at", layer, visit) | ("done",) | ("error", exception); visit counts the input's layer calls
    where: dict[int, tuple] = {}
    turn: list[tuple[int, int] | None] = [None]
    stop = [False]

    def pre_hook(index: int):
        def hook(module: torch.nn.Module, args: Any) -> None:
            mine = getattr(local, "input", None)
            if mine is None:  # a forward outside the run (not one of its threads)
                return
            with cond:
                visit = where[mine][2] + 1 if where.get(mine, ("",))[0] == "at" else 0
                where[mine] = ("at", index, visit)
                cond.notify_all()
                cond.wait_for(lambda: stop[0] or turn[0] == (mine, visit))
                if stop[0]:
                    raise _Aborted()
        return hook

    def worker(index: int, item: Any) -> None:
        local.input = index
        torch.set_num_threads(intra_op)  # per thread with OpenMP: the caller's count, so its kernels reduce alike
        try:  # grad and inference modes are per thread: the caller's (Lightning's loops run in inference mode)
            with torch.inference_mode() if inference else torch.no_grad():
                forward(item)
            result: tuple = ("done",)
        except BaseException as err:  # noqa: BLE001 - handed to the coordinator
            result = ("error", err)
        with cond:
            where[index] = result
            cond.notify_all()

    def wait(index: int, state: tuple | None) -> tuple:
        with cond:
            cond.wait_for(lambda: where.get(index) != state)
            return where[index]

    def next_layer(states: list[tuple], visit: int) -> int | None:
        """The layer every input waits at for its visit ``visit`` (None: all finished); an error when they differ."""
        for state in states:
            if state[0] == "error":
                raise state[1]
        places = {state[1] if state[0] == "at" else None for state in states}
        if len(places) > 1 or any(state[0] == "at" and state[2] != visit for state in states):
            found = ", ".join(f"input {i}: " + (f"decoder layer {s[1]}" if s[0] == "at" else "finished")
                              for i, s in enumerate(states))
            raise RuntimeError(f"the forwards left decoder-layer visit {visit} for different places ({found}): "
                               "this model does not run its decoder layers in the same order for every input")
        return places.pop()

    handles = [layer.register_forward_pre_hook(pre_hook(i)) for i, layer in enumerate(layers)]
    threads, outside = [], outside_modules(model, path)
    skeleton.load(outside)
    try:
        states = []
        for index, item in enumerate(inputs):  # each forward up to its first decoder layer, one at a time
            thread = threading.Thread(target=worker, args=(index, item), daemon=True,
                                      name=f"lightprune-forward-{index}")
            threads.append(thread)
            thread.start()
            states.append(wait(index, None))
        visit, layer = 0, next_layer(states, 0)
        while layer is not None:
            if visit >= len(layers) and progress is not None and getattr(progress, "total", None) is not None:
                progress.total += len(threads)  # a loop: more visits than layers
            skeleton.load([names[layer]])
            for index in range(len(threads)):
                if before is not None:
                    before(index, layer)
                with cond:
                    turn[0] = (index, visit)
                    cond.notify_all()
                states[index] = wait(index, ("at", layer, visit))
                if progress is not None:
                    progress.update(1)
            skeleton.release([names[layer]])
            visit += 1
            layer = next_layer(states, visit)
    finally:
        with cond:
            stop[0] = True
            cond.notify_all()
        for thread in threads:
            thread.join()
        for handle in handles:
            handle.remove()
        skeleton.release(names)
        skeleton.release(outside)

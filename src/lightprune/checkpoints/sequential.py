"""A skeleton's model run with one decoder layer in memory at a time.

Everything outside the decoder layers (embeddings, final norm, LM head, rotary tables, a vision tower) is loaded
once, and the model's own ``forward`` runs unchanged (its masks, position embeddings, whatever it does between
layers, as Qwen3-VL's deepstack), so anything else that works on the model works too (``mask_experts``, the
observing experts implementation of calibration, the attention probe):

- [`layer_by_layer`][]: each decoder layer is loaded by a forward pre-hook just before it runs and released
  just after: one forward, every layer read once;
- [`run_in_lockstep`][]: many forwards, of one skeleton's model or of several skeletons' models with as many
  decoder layers (a checkpoint and its pruned copy), each layer read once for all of them (once per pass for a model
  that loops over some of its layers). Each forward runs in its own thread and waits at every decoder layer; visit
  by visit and skeleton by skeleton, the layer is loaded, the skeleton's forwards run it one after the other (each
  up to its next layer), a callback may look at the resident layer, and it is released. Memory holds one layer plus
  every forward's activations at a layer boundary (what a layer-input cache holds), and only one forward computes
  at a time. [`run_layer_outer`][]: many batches through one skeleton's model.

Both ask for the next layer's bytes as a layer is loaded ([`Skeleton.prefetch`][..skeleton.Skeleton.prefetch]), so the
disk reads it while this one computes; on a GPU the
layer's copies to the device are queued on a stream of their own (`lightprune.checkpoints.device`).

Activations at the layer boundaries ([`BoundaryActivations`][]): the forwards of [`run_in_lockstep`][] waiting
at a decoder layer keep their hidden states on the device while they fit a budget of bytes (default: unbounded on
the CPU, half the GPU memory free when the run starts); a forward arriving beyond it has its hidden states moved to
(pinned) host memory while it waits and back when its turn comes. The tensor object stays the one the model's
forward holds (its data is swapped), so nothing of the model changes; a view of it that the model keeps elsewhere
keeps its device memory. The run returns what it held and moved.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from lightprune.checkpoints.skeleton import Skeleton
from lightprune.models.layer import find_decoder_layers

__all__ = ["BoundaryActivations", "layer_by_layer", "run_in_lockstep", "run_layer_outer"]


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

    def before(name: str, following: str | None):
        def hook(module: nn.Module, args: Any, kwargs: Any = None) -> None:
            skeleton.load([name])
            if following is not None:  # the disk reads the next layer while this one computes
                skeleton.prefetch([following])
        return hook

    def after(name: str):
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            skeleton.release([name])
            if progress is not None:
                progress.update(1)
        return hook

    skeleton.load(outside)
    try:
        for name, following, layer in zip(names, [*names[1:], None], layers, strict=True):
            handles.append(layer.register_forward_pre_hook(before(name, following)))
            handles.append(layer.register_forward_hook(after(name)))
        yield model
    finally:
        for handle in handles:
            handle.remove()
        skeleton.release(names)
        skeleton.release(outside)


class BoundaryActivations:
    """The hidden states of the forwards waiting at a decoder layer's entry (see the module docstring): at most
    ``budget`` bytes (None: no bound) on ``device``, the rest on the host until their forward's turn. Reports
    ``peak_bytes`` (the most held on the device at once), ``spills`` and ``spilled_bytes`` (how often and how much
    was moved out)."""

    def __init__(self, device: torch.device, budget: int | None):
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
            raise ValueError(f"activation_budget must be a number of bytes >= 0 or None, got {budget!r}")
        self.device, self.budget = device, budget
        self._held: dict[int, int] = {}
        self.peak_bytes = self.spills = self.spilled_bytes = 0

    @staticmethod
    def hidden(args: tuple, kwargs: dict) -> torch.Tensor | None:
        """The hidden states a decoder layer is called with (its first argument, or ``hidden_states``)."""
        found = args[0] if args else kwargs.get("hidden_states")
        return found if isinstance(found, torch.Tensor) else None

    def arrive(self, run: int, tensor: torch.Tensor | None) -> bool:
        """Run ``run`` waits with ``tensor``: kept on the device when it fits the budget, else moved to the host
        (returns True)."""
        if tensor is None or tensor.device != self.device:
            return False
        size = tensor.nbytes
        if self.budget is None or sum(self._held.values()) + size <= self.budget:
            self._held[run] = size
            self.peak_bytes = max(self.peak_bytes, sum(self._held.values()))
            return False
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=self.device.type == "cuda")
        host.copy_(tensor, non_blocking=True)
        tensor.data = host  # the device memory is freed (stream-ordered) unless another tensor shares it
        self.spills, self.spilled_bytes = self.spills + 1, self.spilled_bytes + size
        return True

    def leave(self, run: int, tensor: torch.Tensor | None, spilled: bool) -> None:
        """Run ``run``'s turn: its hidden states back on the device."""
        self._held.pop(run, None)
        if spilled and tensor is not None:
            tensor.data = tensor.data.to(self.device, non_blocking=True)

    def report(self) -> dict[str, int | None]:
        return {"budget_bytes": self.budget, "peak_bytes": self.peak_bytes, "spills": self.spills,
                "spilled_bytes": self.spilled_bytes}


def default_activation_budget(device: torch.device) -> int | None:
    """Half the memory free on a GPU now; no bound on the CPU (the host is where spilled activations would go)."""
    if device.type != "cuda":
        return None
    return torch.cuda.mem_get_info(device)[0] // 2


class _Aborted(Exception):
    """Raised in a waiting forward when the run stops."""


def run_layer_outer(skeleton: Skeleton, inputs: Sequence[Any], forward: Callable[[Any], Any],
                    before: Callable[[int, int], None] | None = None, progress: Any = None,
                    activation_budget: int | None | str = "auto") -> dict[str, int | None]:
    """Run ``forward(inputs[i])`` (a call of ``skeleton.model``) for every input, each decoder layer loaded once per
    visit ([`run_in_lockstep`][], whose ``before``, ``progress`` and ``activation_budget`` these are, and whose
    report it returns)."""
    return run_in_lockstep([(skeleton, functools.partial(forward, item)) for item in inputs], before=before,
                           progress=progress, activation_budget=activation_budget)


def run_in_lockstep(runs: Sequence[tuple[Skeleton, Callable[[], Any]]], *,
                    before: Callable[[int, int], None] | None = None,
                    after: Callable[[int, Skeleton], None] | None = None, progress: Any = None,
                    activation_budget: int | None | str = "auto") -> dict[str, int | None]:
    """Run every ``forward()`` of ``runs`` (a call of its skeleton's model), each skeleton's decoder layer loaded
    once per visit for all its runs (see the module docstring); at each visit the skeletons take their turns in the
    order of their first run. ``before(i, layer)`` runs before run ``i`` enters decoder layer ``layer``;
    ``after(layer, skeleton)`` once every run of ``skeleton`` has left it, while it is still resident;
    ``progress``: a tqdm bar advanced once per (layer visit, run). An error in a forward stops the run and is
    raised. ``activation_budget``: bytes of hidden states kept on the device by the forwards waiting at a layer
    ([`BoundaryActivations`][]; "auto": `default_activation_budget` of the first skeleton's device, None:
    no bound); returns `BoundaryActivations.report`.

    The layers are visited in the order the forwards call them, which must be the same for every run (the
    skeletons' models have as many decoder layers): once each in order for most models; a model that loops over a
    span of its layers (Inkling 2 Loop runs layers 6-17 three times) visits that span once per pass, each visit
    reading its layer again."""
    skeletons = list({id(skeleton): skeleton for skeleton, _ in runs}.values())
    found = [find_decoder_layers(skeleton.model) for skeleton in skeletons]
    counts = {len(layers) for _, layers in found}
    if len(counts) > 1:
        raise ValueError(f"run_in_lockstep: the skeletons' models have {sorted(counts)} decoder layers: they can only "
                         "run in step with as many layers")
    names = [[f"{path}.{index}" for index in range(len(layers))] for path, layers in found]
    outside = [outside_modules(skeleton.model, path) for skeleton, (path, _) in zip(skeletons, found, strict=True)]
    cond, local, intra_op = threading.Condition(), threading.local(), torch.get_num_threads()
    inference = torch.is_inference_mode_enabled()
    # run -> ("at", layer, visit) | ("done",) | ("error", exception); visit counts the run's layer calls
    where: dict[int, tuple] = {}
    turn: list[tuple[int, int] | None] = [None]
    stop = [False]

    boundary: list[BoundaryActivations] = []  # made once the outside modules are on the device

    def pre_hook(index: int):
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            mine = getattr(local, "run", None)
            if mine is None:  # a forward outside the run (not one of its threads)
                return
            hidden = BoundaryActivations.hidden(args, kwargs)
            with cond:
                spilled = boundary[0].arrive(mine, hidden)
                visit = where[mine][2] + 1 if where.get(mine, ("",))[0] == "at" else 0
                where[mine] = ("at", index, visit)
                cond.notify_all()
                cond.wait_for(lambda: stop[0] or turn[0] == (mine, visit))
                boundary[0].leave(mine, hidden, spilled)
                if stop[0]:
                    raise _Aborted()
        return hook

    def worker(index: int, forward: Callable[[], Any]) -> None:
        local.run = index
        torch.set_num_threads(intra_op)  # per thread with OpenMP: the caller's count, so its kernels reduce alike
        try:  # grad and inference modes are per thread: the caller's (Lightning's loops run in inference mode)
            with torch.inference_mode() if inference else torch.no_grad():
                forward()
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
        """The layer every run waits at for its visit ``visit`` (None: all finished); an error when they differ."""
        for state in states:
            if state[0] == "error":
                raise state[1]
        places = {state[1] if state[0] == "at" else None for state in states}
        if len(places) > 1 or any(state[0] == "at" and state[2] != visit for state in states):
            where_now = ", ".join(f"run {i}: " + (f"decoder layer {s[1]}" if s[0] == "at" else "finished")
                                  for i, s in enumerate(states))
            raise RuntimeError(f"the forwards left decoder-layer visit {visit} for different places ({where_now}): "
                               "the model(s) do not run their decoder layers in the same order for every run")
        return places.pop()

    handles = [layer.register_forward_pre_hook(pre_hook(i), with_kwargs=True) for _, layers in found
               for i, layer in enumerate(layers)]
    threads: list[threading.Thread] = []
    try:
        for skeleton, modules in zip(skeletons, outside, strict=True):
            skeleton.load(modules)
        device = skeletons[0].device
        boundary.append(BoundaryActivations(device, default_activation_budget(device)
                                            if activation_budget == "auto" else activation_budget))
        states = []
        for index, (_, forward) in enumerate(runs):  # each forward up to its first decoder layer, one at a time
            thread = threading.Thread(target=worker, args=(index, forward), daemon=True,
                                      name=f"lightprune-forward-{index}")
            threads.append(thread)
            thread.start()
            states.append(wait(index, None))
        visit, layer = 0, next_layer(states, 0)
        while layer is not None:
            if visit >= len(names[0]) and progress is not None and getattr(progress, "total", None) is not None:
                progress.total += len(threads)  # a loop: more visits than layers
            for skeleton, layer_names in zip(skeletons, names, strict=True):
                skeleton.load([layer_names[layer]])
                if layer + 1 < len(layer_names):  # the disk reads the next layer while this one computes
                    skeleton.prefetch([layer_names[layer + 1]])
                for index in (i for i, (owner, _) in enumerate(runs) if owner is skeleton):
                    if before is not None:
                        before(index, layer)
                    with cond:
                        turn[0] = (index, visit)
                        cond.notify_all()
                    states[index] = wait(index, ("at", layer, visit))
                    if progress is not None:
                        progress.update(1)
                if after is not None:
                    after(layer, skeleton)
                skeleton.release([layer_names[layer]])
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
        for skeleton, layer_names, modules in zip(skeletons, names, outside, strict=True):
            skeleton.release(layer_names)
            skeleton.release(modules)
    return boundary[0].report()

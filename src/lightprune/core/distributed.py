"""Multi-process helpers: ZeRO-3 gathering, rank agreement, and un-partitioning for surgery and export.

Why one module: under DeepSpeed ZeRO-3 every parameter is a flat partition on each rank (shape
``[0]`` outside a gather); under DDP and ZeRO-1/2 every rank holds full, identical parameters.
lightprune's weight reads, surgery and export need full tensors, so each of them goes through
the few functions here, and the rest of the package never imports deepspeed (it is imported
lazily, only once a partitioned parameter is seen).

- `gathered` / `gathered_module`: ``deepspeed.zero.GatheredParameters`` over a few
  parameters (one MoE layer's router and experts, one module's own parameters), never the whole
  model; a plain context when nothing is partitioned. A gather is a collective: every rank must
  enter it, in the same order (the callbacks run on every rank).
- `raise_on_every_rank`: a step that may fail on one rank (a refused calibration batch) before a
  collective: every rank raises, none waits in the collective.
- `same_on_every_rank`: every rank computes a plan (or scores) from the same gathered
  weights or the same all-reduced statistics; this checks that the results agree (one small
  ``all_gather_object``) and raises on every rank at once if they do not.
- `outside_zero_init`: build a module with ordinary parameters inside Lightning's
  ``deepspeed.zero.Init`` context (``configure_model`` under ZeRO-3). Code that writes weights
  after construction (a checkpoint load without transformers' own ZeRO-3 support, a seeded
  re-draw, peft's LoRA initialisation) writes into empty partitions there and silently does
  nothing; DeepSpeed partitions the finished module when its engine starts instead.
- `materialize`: turn a ZeRO-3 model into a plain one at the end of a job, one module at a
  time (gather, copy, release), with the full values on rank 0 and tensors of the same shapes on
  the ``meta`` device elsewhere, so structural surgery (which changes shapes, and so cannot be
  written back through ``GatheredParameters(modifier_rank=0)``, which re-partitions the old
  shapes) runs on an ordinary module. Rank 0 then holds one full copy (on ``device``, CPU by
  default) and no other rank holds any; the DeepSpeed engine's module hooks are removed first.

Outside ``torch.distributed`` (one process, or ``lightprune export`` launched once) every
helper is a no-op.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn

__all__ = ["is_distributed", "rank", "world_size", "is_partitioned", "has_partitioned", "partitioned_of",
           "gathered", "gathered_module", "layer_parameters", "same_on_every_rank", "broadcast_object",
           "materialize", "remove_zero3_hooks", "outside_zero_init", "PartitionedModelError", "RankFailedError",
           "raise_on_every_rank"]


class PartitionedModelError(ValueError):
    """A function that needs full tensors got a model with ZeRO-3 partitioned parameters."""


# ---------------------------------------------------------------------------------------- ranks
def is_distributed() -> bool:
    """True inside an initialised ``torch.distributed`` process group with more than one rank."""
    return torch.distributed.is_available() and torch.distributed.is_initialized() \
        and torch.distributed.get_world_size() > 1


def rank() -> int:
    """This process's global rank (0 outside a process group)."""
    return torch.distributed.get_rank() if is_distributed() else 0


def world_size() -> int:
    """Number of ranks (1 outside a process group)."""
    return torch.distributed.get_world_size() if is_distributed() else 1


# ---------------------------------------------------------------------------------------- ZeRO-3
def is_partitioned(tensor: Any) -> bool:
    """True for a DeepSpeed ZeRO-3 parameter (it carries ``ds_id``; its data is a partition outside a gather)."""
    return hasattr(tensor, "ds_id")


def partitioned_of(params: Iterable[Any]) -> list[nn.Parameter]:
    """The ZeRO-3 parameters among ``params``, each once, in order."""
    seen, out = set(), []
    for p in params:
        if is_partitioned(p) and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def has_partitioned(model: nn.Module) -> bool:
    """True when any parameter of ``model`` is a ZeRO-3 partition."""
    return any(is_partitioned(p) for p in model.parameters())


@contextmanager
def gathered(params: Iterable[Any], modifier_rank: int | None = None) -> Iterator[None]:
    """Gather the ZeRO-3 partitions among ``params`` for the block (a collective); plain context otherwise.

    ``modifier_rank``: the rank whose in-place changes are broadcast to the others on exit (same
    shapes only; DeepSpeed re-partitions them). Without it a change inside the block is an error.
    """
    parts = partitioned_of(params)
    if not parts:
        with nullcontext():
            yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(parts, modifier_rank=modifier_rank):
        yield


def gathered_module(module: nn.Module, recurse: bool = True, modifier_rank: int | None = None):
    """`gathered` over ``module``'s parameters (its own only when ``recurse`` is False)."""
    return gathered(module.parameters(recurse=recurse), modifier_rank=modifier_rank)


def layer_parameters(layer: Any) -> list[nn.Parameter]:
    """One MoE layer's router (with any adapter wrapped around it) and routed-expert parameters."""
    params = list(layer.router.parameters()) + list(layer.experts.parameters())
    return params


_SUSPENDED = False  # an outside_zero_init block is active (nested blocks leave the switch alone)


@contextmanager
def outside_zero_init() -> Iterator[None]:
    """Suspend an active ``deepspeed.zero.Init`` for the block (modules built here keep full parameters).

    A plain context when deepspeed was never imported or no ``zero.Init`` is active. Re-entrant: only the
    outermost block suspends and restores (DeepSpeed's own switch is not a counter).
    """
    import sys

    global _SUSPENDED
    if "deepspeed" not in sys.modules or _SUSPENDED:
        yield
        return
    from deepspeed.runtime.zero import partition_parameters as zp

    active = zp.top_level_context is not None
    if active:
        zp.shutdown_init_context()
        _SUSPENDED = True
    try:
        yield
    finally:
        if active:
            _SUSPENDED = False
            zp.restore_init_context()


# ---------------------------------------------------------------------------------------- agreement
def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` as rank ``src`` has it, on every rank (picklable objects; returns ``obj`` in one process)."""
    if not is_distributed():
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=src)
    return box[0]


def same_on_every_rank(value: Any, what: str) -> Any:
    """Check that every rank computed an equal ``value`` (compared with ``==``); return it.

    Raises RuntimeError on every rank, naming ``what`` and the ranks that disagree with rank 0:
    a plan computed from the same gathered weights or all-reduced statistics must not differ.
    """
    if not is_distributed():
        return value
    values: list[Any] = [None] * world_size()
    torch.distributed.all_gather_object(values, value)
    differ = [r for r, v in enumerate(values) if not v == values[0]]
    if differ:
        raise RuntimeError(f"{what} differs between rank 0 and ranks {differ}: every rank must compute it from "
                           "the same gathered weights / all-reduced statistics")
    return values[0]


class RankFailedError(RuntimeError):
    """Another rank's part of a collective step failed (its error's type and message are in this one's)."""


def raise_on_every_rank(step: Callable[[], Any]) -> Any:
    """Run ``step()`` on this rank and return what it returns; in a process group the ranks then agree (one small
    ``all_gather_object``): when any rank's step raised, every rank raises, the failed one its own error and the
    others `RankFailedError` naming the first failed rank and its error, so that no rank waits for the
    others in a later collective."""
    error: Exception | None = None
    result = None
    try:
        result = step()
    except Exception as err:  # noqa: BLE001 - told to the other ranks, then raised
        error = err
    if not is_distributed():
        if error is not None:
            raise error
        return result
    said: list[Any] = [None] * world_size()
    torch.distributed.all_gather_object(said, None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    failed = [(r, message) for r, message in enumerate(said) if message is not None]
    if failed:
        raise RankFailedError(f"rank {failed[0][0]} failed, so this rank stops too: {failed[0][1]}")
    return result


# ---------------------------------------------------------------------------------------- un-partitioning
def remove_zero3_hooks(engine: Any) -> bool:
    """Remove the ZeRO-3 module hooks a DeepSpeed engine installed (they fetch partitions on forward).

    ``engine``: a ``deepspeed.DeepSpeedEngine`` (Lightning's ``trainer.strategy.model``), or anything
    else (then nothing happens). Returns True when hooks were removed.
    """
    optimizer = getattr(engine, "optimizer", None)
    offload = getattr(optimizer, "parameter_offload", None) or optimizer
    remove = getattr(offload, "_remove_module_hooks", None)
    if not callable(remove) or getattr(offload, "_lightprune_hooks_removed", False):
        return False
    remove()
    offload._lightprune_hooks_removed = True
    return True


@torch.no_grad()
def materialize(model: nn.Module, engine: Any = None, device: str | torch.device = "cpu",
                src: int = 0) -> int:
    """Replace every ZeRO-3 parameter of ``model`` by a plain one, module by module; returns how many.

    Each module's own parameters are gathered together (a collective: every rank calls this),
    copied and released before the next module is gathered, so the largest transient is one
    module's parameters. Rank ``src`` keeps the values on ``device``; the other ranks get ``meta``
    tensors of the same shapes (enough for the same structural surgery, no memory). Dtypes are
    kept (16-bit under ``bf16-mixed`` / ``16-mixed``). ``engine``'s hooks are removed first (see
    `remove_zero3_hooks`); without an engine the hooks must already be gone. A model with
    no partitioned parameter is left as it is.
    """
    if not has_partitioned(model):
        return 0
    if engine is not None:
        remove_zero3_hooks(engine)
    keep = rank() == src
    target = torch.device(device) if keep else torch.device("meta")
    count = 0
    for module in model.modules():
        own = [(name, p) for name, p in module._parameters.items() if is_partitioned(p)]
        if not own:
            continue
        with gathered([p for _, p in own]):
            for name, p in own:
                data = p.data.to(target, copy=True) if keep else torch.empty(p.ds_shape, dtype=p.dtype, device=target)
                module._parameters[name] = nn.Parameter(data, requires_grad=p.requires_grad)
                count += 1
    _retie(model)
    return count


def _retie(model: nn.Module) -> None:
    """Tie input and output embeddings again when the config asks for it (one parameter object, as before)."""
    tie = getattr(model, "tie_weights", None)
    config = getattr(model, "config", None)
    if callable(tie) and getattr(config, "tie_word_embeddings", False):
        tie()

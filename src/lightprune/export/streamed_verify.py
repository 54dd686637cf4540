"""Verification of a checkpoint pruned shard by shard, one layer in memory at a time:
:func:`verify_pruned_checkpoint`.

1. The whole model: probe token ids run through the pruned checkpoint and through the masked source; the logits
   must agree.
2. Layer by layer: for each MoE layer, the pruned layer's routed output (its router's selection, its experts) on
   what the source layer's router and experts received in that forward equals the source layer's with the plan's
   experts masked (the family's own masked routing, as ``mask_experts`` runs it).

Both in one pass (:func:`lightprune.checkpoints.sequential.run_in_lockstep`): the two forwards run in step, decoder
layer ``i`` of the source then of the pruned checkpoint resident, the source layer's masked routed output computed
while it is and the pruned layer's compared with it while that one is: every byte of either checkpoint is read once,
one layer is in memory at a time, and the pruned layer is read into the memory the source layer released (a shared
:class:`~lightprune.checkpoints.pool.ReadPool`).

Each within ``atol + rtol * max|reference|`` (:func:`~lightprune.export.verify.compare`: the error of a rounded
sum scales with the magnitude of its terms, so the scale is the reference's largest magnitude), else
:class:`~lightprune.export.verify.ExportVerificationError` naming the layer or the logits difference. ``atol``
default 1e-5 for fp32 weights, 1e-2 for bf16/fp16 (the floor for a reference near zero); ``rtol`` =
``sqrt(L) * (2 u + 8 u32 sqrt(K))`` (:func:`~lightprune.export.verify.default_rtol`: ``u`` the weights' unit
roundoff, at least fp32's, ``u32`` fp32's, ``K`` the widest input of a weight matrix) with ``L`` = the decoder
layers for the logits and ``L`` = 1 for one layer's routed output, whose inputs are the same on both sides. The
manifest's ``verification`` entry records each comparison: the difference, ``max|reference|``, ``atol``, ``rtol``
and the tolerance applied.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

import torch
from tqdm.auto import tqdm

from lightprune.checkpoints.pool import ReadPool
from lightprune.checkpoints.reader import Checkpoint
from lightprune.checkpoints.sequential import run_in_lockstep
from lightprune.checkpoints.skeleton import Skeleton
from lightprune.core.checks import check_atol
from lightprune.experts.mask import mask_experts
from lightprune.experts.plan import ExpertPlan
from lightprune.export.verify import (
    Comparison,
    ExportVerificationError,
    compare,
    default_atol,
    default_probe,
    default_rtol,
    model_logits,
)
from lightprune.models import MoELayer, find_moe_layers

__all__ = ["verify_pruned_checkpoint", "routed_output"]


@torch.no_grad()
def routed_output(layer: MoELayer, router_input: torch.Tensor, expert_input: torch.Tensor,
                  mask: torch.Tensor | None) -> torch.Tensor:
    """The layer's routed experts' output [T, H] on what its router and its experts were called with ([T, H], and
    [T, H'] for experts that read a projection), with the experts in ``mask`` removed from the selection."""
    return layer.family.routed_output(layer, router_input, expert_input, mask)


def verify_pruned_checkpoint(source: Checkpoint, plan: ExpertPlan, out_dir: str | os.PathLike, *,
                             atol: float | None = None, probe_tokens: int = 16, seed: int = 0,
                             progress: bool = True) -> dict[str, Any]:
    """Check the checkpoint at ``out_dir`` against ``source`` pruned by ``plan`` (see the module docstring);
    returns the manifest's ``verification`` entry. The layer checks run on what each MoE layer's router and experts
    received in the masked source's forward of the probe."""
    atol = check_atol(atol)
    pool = ReadPool()  # the pruned layer read into the source layer's memory, and back
    original = Skeleton(source, pool=pool)
    with Checkpoint(out_dir) as written:
        pruned = Skeleton(written, pool=pool)
        atol = default_atol(original.model) if atol is None else atol
        layer_rtol = default_rtol(original.model, layers=1)
        probe = default_probe(original.model, shape=(2, probe_tokens), seed=seed)
        inputs: dict[int, list[torch.Tensor]] = {}
        expected: dict[int, torch.Tensor] = {}
        logits: dict[str, torch.Tensor] = {}
        blocks: dict[int, Comparison] = {}
        source_moe = {layer.index: layer for layer in find_moe_layers(original.model)}
        pruned_moe = {layer.index: layer for layer in find_moe_layers(pruned.model)}

        def check(index: int, skeleton: Skeleton) -> None:
            if index not in source_moe:
                return
            layer = source_moe[index]
            if skeleton is original:
                expected[index] = _masked_output(layer, plan, inputs.get(index))
                return
            router_input, expert_input = inputs.pop(index)
            got = routed_output(pruned_moe[index], router_input, expert_input, None)
            found = compare(got, expected.pop(index), atol, layer_rtol, what=f"layer {index}'s routed experts")
            if not found.ok:
                raise ExportVerificationError(
                    f"layer {index} ({layer.name}) of the pruned checkpoint: its routed experts' output differs from "
                    f"the masked source layer's by up to {found.describe()}; nothing was written",
                    found.max_abs_diff, atol, tolerance=found.tolerance)
            if index not in blocks or found.max_abs_diff > blocks[index].max_abs_diff:  # a looped layer's worst
                blocks[index] = found

        def run(skeleton: Skeleton, what: str) -> None:
            logits[what] = model_logits(skeleton.model, probe, device=skeleton.device)

        with tqdm(desc="verifying", unit="layer", leave=False, disable=not progress) as bar, \
                _capture(original, inputs), mask_experts(original.model, plan):
            run_in_lockstep([(original, functools.partial(run, original, "reference")),
                             (pruned, functools.partial(run, pruned, "pruned"))], after=check, progress=bar)
    for layer in source_moe.values():
        if layer.index not in blocks:
            raise ExportVerificationError(f"layer {layer.index} ({layer.name}): the probe's forward never reached its "
                                          "router and experts, so it could not be checked; nothing was written")
    diff = compare(logits["pruned"], logits["reference"], atol, default_rtol(original.model),
                   what="pruned checkpoint, run layer by layer")
    if not diff.ok:
        raise ExportVerificationError(
            f"the pruned checkpoint's logits, run layer by layer, differ from the masked source's by up to "
            f"{diff.describe()}; nothing was written", diff.max_abs_diff, atol, tolerance=diff.tolerance)
    return {"max_abs_diff": max([diff.max_abs_diff, *(c.max_abs_diff for c in blocks.values())]), "atol": atol,
            "sequential_logits": diff.max_abs_diff, "logits": diff.record(),
            "blocks": {str(k): v.record() for k, v in sorted(blocks.items())},
            "probe_shapes": {"input_ids": list(probe["input_ids"].shape)}}


@contextlib.contextmanager
def _capture(skeleton: Skeleton, inputs: dict[int, list[torch.Tensor]]) -> Iterator[None]:
    """Record what each MoE layer's router and experts are called with (their first argument), by layer."""
    handles = []
    for layer in find_moe_layers(skeleton.model):
        both = layer.family.experts_read_router_input  # Llama 4: the router's input is the experts' too
        for slot, module in enumerate((layer.router,) if both else (layer.router, layer.experts)):
            def hook(module: torch.nn.Module, args: Any, index: int = layer.index, slot: int = slot,
                     both: bool = both) -> None:
                found = args[0].detach().reshape(-1, args[0].shape[-1])
                inputs.setdefault(index, [None, None])[slot] = found
                if both:
                    inputs[index][1] = found
            handles.append(module.register_forward_pre_hook(hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _masked_output(layer: MoELayer, plan: ExpertPlan, inputs: list[torch.Tensor] | None) -> torch.Tensor:
    """The source ``layer``'s routed output with the plan's experts masked, on what its router and experts received
    in the probe's forward (``inputs``)."""
    if inputs is None or any(x is None for x in inputs):
        raise ExportVerificationError(f"layer {layer.index} ({layer.name}): the probe's forward never reached its "
                                      "router and experts, so it could not be checked; nothing was written")
    mask = None
    if layer.index in plan.keep:
        mask = torch.ones(layer.num_experts, dtype=torch.bool)
        mask[list(plan.keep[layer.index])] = False
    return routed_output(layer, *inputs, mask)

"""Verification of a checkpoint pruned shard by shard, one layer in memory at a time:
`verify_pruned_checkpoint`.

1. The whole model: probe token ids run through the pruned checkpoint and through the masked source; the logits
   must agree.
2. Layer by layer, for each MoE layer, on what the source layer's router and experts received in that forward:

   - the pruned layer's routed output (its router's selection, its experts) equals the source layer's with the
     plan's experts masked (the family's own masked routing, as ``mask_experts`` runs it);
   - the pruned router's logits equal the source router's columns of the kept experts, in order: every kept
     expert's router row;
   - every kept expert's MLP, not only those the probe's tokens select: the experts module is called with a
     forced selection that names each kept expert (source ids on the source layer, their positions on the pruned
     one), every row a different weight per slot, so that two experts written under each other's index (or a
     mis-sliced one) change the output even when no probe token routes to them (a weighted sum with equal weights
     would not see two experts of one row swapped). Llama 4's block runs every expert on every token, so its
     routed output already covers every kept expert.

   Both sides run the same operations in the checkpoint's dtype on the same inputs: a faithful write agrees to the
   rounding of a reordered sum (the tolerance below), a swapped, mis-sliced or missing expert by the size of an
   expert's output.

Both in one pass ([`run_in_lockstep`][lightprune.checkpoints.sequential.run_in_lockstep]): the two forwards run in step,
decoder layer ``i`` of the source then of the pruned checkpoint resident, the source layer's three outputs computed
while it is and the pruned layer's compared with them while that one is: every byte of either checkpoint is read once,
one layer is in memory at a time, and the pruned layer is read into the memory the source layer released (a shared
[`ReadPool`][lightprune.checkpoints.pool.ReadPool]).

NaN or inf in what the masked source computes (a layer's MoE input or output, the logits) is the source's fault,
not the export's: an [`ExportVerificationError`][..verify.ExportVerificationError] saying so, before any comparison.

Each within ``atol + rtol * max|reference|`` (`compare`: the error of a rounded
sum scales with the magnitude of its terms, so the scale is the reference's largest magnitude), else
[`ExportVerificationError`][..verify.ExportVerificationError] naming the layer or the logits difference. ``atol``
default 1e-5 for fp32 weights, 1e-2 for bf16/fp16 (the floor for a reference near zero); ``rtol`` =
``sqrt(L) * (2 u + 8 u32 sqrt(K))`` (`default_rtol`: ``u`` the weights' unit
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
from lightprune.experts.mask import mask_experts
from lightprune.experts.plan import ExpertPlan
from lightprune.export.verification import Verification, mismatch
from lightprune.export.verify import (
    BROKEN_SOURCE,
    Comparison,
    ExportVerificationError,
    compare,
    model_logits,
    non_finite,
)
from lightprune.models import MoELayer, find_moe_layers

__all__ = ["verify_pruned_checkpoint"]


def verify_pruned_checkpoint(source: Checkpoint, plan: ExpertPlan, out_dir: str | os.PathLike, *,
                             probe_tokens: int = 16, seed: int = 0, progress: bool = True, device: Any = "cpu",
                             verification: Verification | None = None) -> dict[str, Any]:
    """Check the checkpoint at ``out_dir`` against ``source`` pruned by ``plan`` (see the module docstring), both
    read to and run on ``device``; returns the manifest's ``verification`` entry. The layer checks run on what each
    MoE layer's router and experts received in the masked source's forward of the probe. ``verification``: the
    export's ([`prune_checkpoint`][...streamed.prune_checkpoint] has checked ``atol`` and the plan), else one made
    here (the default ``atol``, the plan checked here)."""
    plan_checked = verification is not None
    verification = verification or Verification()
    pool = ReadPool()  # the pruned layer read into the source layer's memory, and back (on the CPU)
    original = Skeleton(source, pool=pool, mtp=True, device=device)
    with Checkpoint(out_dir) as written:
        pruned = Skeleton(written, pool=pool, mtp=True, device=device)
        atol, layer_rtol = verification.tolerance(original.model, layers=1)
        probe = verification.probe_for(original.model, shape=(2, probe_tokens), seed=seed)
        inputs: dict[int, list[torch.Tensor]] = {}
        expected: dict[int, tuple[dict[str, torch.Tensor], list[torch.Tensor]]] = {}  # source outputs, inputs
        logits: dict[str, torch.Tensor] = {}
        checked: dict[str, dict[int, Comparison]] = {}  # {part: {layer: the comparison}}
        layers = find_moe_layers(original.model)
        source_moe = {layer.index: layer for layer in layers}
        pruned_moe = {layer.index: layer for layer in find_moe_layers(pruned.model)}

        def check(index: int, skeleton: Skeleton) -> None:
            if index not in source_moe:
                return
            layer = source_moe[index]
            kept = sorted(plan.keep[index]) if index in plan.keep else list(range(layer.num_experts))
            if skeleton is original:
                received = inputs.pop(index, None)
                _check_source_finite(layer, "input", *(received or []))
                outputs = _layer_outputs(layer, plan, received, kept, source=True)
                _check_source_finite(layer, "output", *outputs.values())
                expected[index] = (outputs, received)
                inputs.pop(index, None)  # what the check's own calls of the router and experts recorded
                return
            outputs, received = expected.pop(index)
            got = _layer_outputs(pruned_moe[index], plan, received, kept, source=False)
            for part, value in got.items():
                found = compare(value, outputs[part], atol, layer_rtol, what=f"layer {index}'s {part}")
                if not found.ok:
                    raise mismatch(found, f"layer {index} ({layer.name}) of the pruned checkpoint: {_PARTS[part]} "
                                          f"differ(s) from the masked source layer's by up to {found.describe()}; "
                                          "nothing was written")
                worst = checked.setdefault(part, {})
                if index not in worst or found.max_abs_diff > worst[index].max_abs_diff:  # a looped layer's worst
                    worst[index] = found

        def run(skeleton: Skeleton, what: str) -> None:
            logits[what] = model_logits(skeleton.model, probe, device=skeleton.device)

        if not plan_checked:
            plan.check_layers(layers)
        with tqdm(desc="verifying", unit="layer", leave=False, disable=not progress) as bar, \
                _capture(original, inputs), mask_experts(original.model, plan, layers=layers):
            run_in_lockstep([(original, functools.partial(run, original, "reference")),
                             (pruned, functools.partial(run, pruned, "pruned"))], after=check, progress=bar)
    blocks = checked.get("routed output", {})
    for layer in source_moe.values():
        if layer.index not in blocks:
            raise _unreached(layer)
    found = non_finite(logits["reference"])
    if found is not None:
        raise ExportVerificationError(f"the source checkpoint's own logits on the verification probe (before pruning, "
                                      f"the plan's experts masked) hold {found}: {BROKEN_SOURCE}; nothing was written")
    diff = verification.compare(logits["pruned"], logits["reference"], original.model,
                                what="pruned checkpoint, run layer by layer")
    if not diff.ok:
        raise mismatch(diff, f"the pruned checkpoint's logits, run layer by layer, differ from the masked source's by "
                             f"up to {diff.describe()}; nothing was written")
    return {"max_abs_diff": max([diff.max_abs_diff, *(c.max_abs_diff for part in checked.values()
                                                      for c in part.values())]), "atol": atol,
            "sequential_logits": diff.max_abs_diff, "logits": diff.record(),
            "blocks": {str(k): v.record() for k, v in sorted(blocks.items())},
            **{_RECORDS[part]: {str(k): v.record() for k, v in sorted(found.items())}
               for part, found in checked.items() if part != "routed output"},
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


#: what each part of a layer check compares, for its error message; the manifest entry of the parts after the first
_PARTS = {"routed output": "its routed experts' output", "router logits": "its router's logits of the kept experts",
          "kept experts": "its kept experts' outputs under a forced selection of every kept expert"}
_RECORDS = {"router logits": "router_logits", "kept experts": "kept_experts"}


def _check_source_finite(layer: MoELayer, what: str, *tensors: torch.Tensor | None) -> None:
    """Refuse NaN or inf in what the source layer received or computed (``what``: "input" or "output") in the
    probe's forward of the masked source: the source checkpoint is broken, not the export."""
    for tensor in tensors:
        found = non_finite(tensor) if tensor is not None else None
        if found is not None:
            raise ExportVerificationError(
                f"the source checkpoint's own forward on the verification probe (before pruning, the plan's experts "
                f"masked) gives {found} in layer {layer.index}'s ({layer.name}) MoE {what}: {BROKEN_SOURCE}; "
                "nothing was written")


def _unreached(layer: MoELayer) -> ExportVerificationError:
    return ExportVerificationError(f"layer {layer.index} ({layer.name}): the probe's forward never reached its router "
                                   "and experts, so it could not be checked; nothing was written")


@torch.no_grad()
def _layer_outputs(layer: MoELayer, plan: ExpertPlan, inputs: list[torch.Tensor] | None, kept: list[int],
                   source: bool) -> dict[str, torch.Tensor]:
    """What one layer check compares (see the module docstring), on what the source layer's router and experts
    received (``inputs``): {part: tensor}. ``source``: ``layer`` is the source's (the plan's experts masked, kept
    experts named by their ids, the router's kept columns), else the pruned one's (kept experts named by their
    positions)."""
    if inputs is None or any(x is None for x in inputs):
        raise _unreached(layer)
    router_input, expert_input = inputs
    mask = None
    if source and layer.index in plan.keep:
        mask = torch.ones(layer.num_experts, dtype=torch.bool)
        mask[kept] = False
    found = {"routed output": layer.family.routed_output(layer, router_input, expert_input, mask)}
    logits = layer.family.router_logits(layer, router_input)
    # the source's columns of the kept experts, then any identity experts' (the pruned router's rows)
    found["router logits"] = logits[:, layer.router_rows(torch.tensor(kept, dtype=torch.long))] if source else logits
    if not layer.family.experts_read_router_input:
        positions, weights = _forced_selection(len(kept), layer.top_k, rows=min(2, expert_input.shape[0]))
        ids = torch.tensor(kept)[positions] if source else positions
        tokens = expert_input[torch.arange(positions.shape[0]) % min(2, expert_input.shape[0])]
        found["kept experts"] = layer.experts(tokens, ids.to(tokens.device),
                                              weights.to(device=tokens.device, dtype=tokens.dtype))
    return found


def _forced_selection(count: int, top_k: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(positions [R, top_k], weights [R, top_k])``: every position ``0..count-1`` in some row (``count`` >=
    ``top_k``, as a pruned layer keeps), rows of ``top_k`` distinct positions (the last group wraps around), each
    group of positions repeated for ``rows`` tokens and rotated by one slot per token; weights ``(slot + 1) /
    top_k`` by slot, so no two experts of a row weigh the same."""
    groups = -(-count // top_k)
    base = torch.arange(groups * top_k).view(groups, top_k) % count
    positions = torch.cat([base.roll(token, dims=1) for token in range(rows)])  # [rows * groups, k], token-major
    # group-major: row r is read with token r % rows
    positions = positions.view(rows, groups, top_k).transpose(0, 1).reshape(-1, top_k)
    weights = ((torch.arange(top_k) + 1) / top_k).expand(positions.shape[0], top_k)
    return positions, weights.contiguous()

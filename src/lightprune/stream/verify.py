"""Verification of a checkpoint pruned shard by shard, one layer in memory at a time:
:func:`verify_pruned_checkpoint`.

1. Layer by layer: for each MoE layer, the pruned layer's routed output (its router's selection, its experts) on
   seeded probe hidden states equals the source layer's with the plan's experts masked (the family's own masked
   routing, as ``mask_experts`` runs it), both read from disk.
2. The whole model: probe token ids run through the pruned checkpoint and through the masked source, each layer by
   layer (:func:`lightprune.stream.sequential.layer_by_layer`); the logits must agree.

Both within ``atol`` (default 1e-5 for fp32 weights, 1e-2 for bf16/fp16), else
:class:`~lightprune.export.verify.ExportVerificationError` naming the layer or the logits difference.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from lightprune.checks import check_atol
from lightprune.experts.mask import mask_experts
from lightprune.experts.plan import ExpertPlan
from lightprune.export.verify import ExportVerificationError, default_atol, default_probe, max_abs_diff, model_logits
from lightprune.models import MoELayer, find_moe_layers
from lightprune.stream.checkpoint import Checkpoint
from lightprune.stream.sequential import layer_by_layer
from lightprune.stream.skeleton import Skeleton

__all__ = ["verify_pruned_checkpoint", "routed_output"]


@torch.no_grad()
def routed_output(layer: MoELayer, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The layer's routed experts' output [T, H] on ``hidden`` [T, H] (router input and experts input alike), with
    the experts in ``mask`` removed from the selection."""
    _, weights, index = layer.route(hidden, mask)
    return layer.experts(hidden, index, weights.to(hidden.dtype))


def verify_pruned_checkpoint(source: Checkpoint, plan: ExpertPlan, out_dir: str | os.PathLike, *,
                             atol: float | None = None, probe_tokens: int = 16, seed: int = 0,
                             progress: bool = True) -> dict[str, Any]:
    """Check the checkpoint at ``out_dir`` against ``source`` pruned by ``plan`` (see the module docstring);
    returns the manifest's ``verification`` entry."""
    original = Skeleton(source)
    with Checkpoint(out_dir) as written:
        pruned = Skeleton(written)
        atol = check_atol(atol)
        atol = default_atol(original.model) if atol is None else atol
        bar = _bar(progress, "verifying")
        blocks = _check_blocks(original, pruned, plan, atol, probe_tokens, seed, bar)
        probe = default_probe(original.model, shape=(2, probe_tokens), seed=seed)
        with layer_by_layer(original, bar), mask_experts(original.model, plan):
            reference = model_logits(original.model, probe, device=original.device)
        with layer_by_layer(pruned, bar):
            logits = model_logits(pruned.model, probe, device=pruned.device)
        if bar is not None:
            bar.close()
    diff = max_abs_diff(logits, reference, what="pruned checkpoint, run layer by layer")
    if diff > atol:
        raise ExportVerificationError(
            f"the pruned checkpoint's logits, run layer by layer, differ from the masked source's by up to {diff:.3g} "
            f"> atol={atol:g}; nothing was written", diff, atol)
    return {"max_abs_diff": max([diff, *blocks.values()]), "atol": atol, "sequential_logits": diff,
            "blocks": {str(k): v for k, v in sorted(blocks.items())}, "probe_shapes": {
                "input_ids": list(probe["input_ids"].shape), "hidden_states": [probe_tokens, "hidden"]}}


def _check_blocks(original: Skeleton, pruned: Skeleton, plan: ExpertPlan, atol: float, tokens: int, seed: int,
                  bar: Any) -> dict[int, float]:
    after = {layer.index: layer for layer in find_moe_layers(pruned.model)}
    diffs = {}
    for layer in find_moe_layers(original.model):
        gen = torch.Generator().manual_seed(seed * 100_003 + layer.index)
        hidden_size = layer.router_linear.weight.shape[-1]
        hidden = torch.randn(tokens, hidden_size, generator=gen).to(original.dtype)
        mask = None
        if layer.index in plan.keep:
            mask = torch.ones(layer.num_experts, dtype=torch.bool)
            mask[list(plan.keep[layer.index])] = False
        with original.resident(layer.name):  # one layer in memory at a time: the source's, then the pruned one
            expected = routed_output(layer, hidden, mask)
        with pruned.resident(after[layer.index].name):
            got = routed_output(after[layer.index], hidden, None)
        diffs[layer.index] = max_abs_diff(got, expected, what=f"layer {layer.index}'s routed experts")
        if diffs[layer.index] > atol:
            raise ExportVerificationError(
                f"layer {layer.index} ({layer.name}) of the pruned checkpoint: its routed experts' output differs from "
                f"the masked source layer's by up to {diffs[layer.index]:.3g} > atol={atol:g}; nothing was written",
                diffs[layer.index], atol)
        if bar is not None:
            bar.update(1)
    return diffs


def _bar(progress: bool, description: str) -> Any:
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(desc=description, unit="layer", leave=False)

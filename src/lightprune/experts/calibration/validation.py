"""The paper's validations of Delta-H as an importance proxy (MAEP App. I), as functions.

- `ground_truth_kl`: for every MoE layer l and routed expert j, the LM-head KL
  KL(p_full || p_without_j) caused by removing expert j from layer l alone, per sample the mean
  over the sample's subset tokens, then the mean over samples (the averaging Delta-H uses).
  Batched over experts: each batch is repeated once per expert of a chunk and layer l's router
  masks expert j in copy j only (one mask per token row, the family's own selection), so one
  forward scores a whole chunk of experts. Layers before l are recomputed with the copies (the
  replay is not cached); exactness is that of ``mask_experts``, which equals pruning.
- `proxy_correlations`: per layer Spearman rho of each proxy (delta_h, reap, routing_kl,
  ...) against the ground truth, per subset, and the layer mean.
- `ranking_stability`: per layer Spearman rho between the same criterion's values from two
  calibration sets, per subset, and the layer mean.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Mapping

import torch
from torch import nn

from lightprune.core.batch import model_inputs
from lightprune.core.jsonio import strict_int
from lightprune.experts.calibration.result import CalibrationStats
from lightprune.experts.calibration.subsets import base_masks, check_subsets
from lightprune.experts.ranking import spearman
from lightprune.models import MoELayer, find_moe_layers, get_family

__all__ = ["ground_truth_kl", "proxy_correlations", "ranking_stability", "plot_correlations"]


def _repeat(batch: Mapping[str, Any], copies: int) -> dict[str, Any]:
    """Every tensor of the batch concatenated ``copies`` times along dim 0 (copy c = rows c*B..)."""
    return {k: torch.cat([v] * copies) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


@contextmanager
def _row_masked(layer: MoELayer, experts: list[int], rows_per_copy: int) -> Iterator[None]:
    """Layer's router masks expert ``experts[c]`` for the token rows of copy c."""
    router = layer.router
    mask = torch.zeros(len(experts), layer.num_experts, dtype=torch.bool, device=layer.router_linear.weight.device)
    mask[torch.arange(len(experts)), torch.tensor(experts)] = True
    mask = mask.repeat_interleave(rows_per_copy, dim=0)
    family = layer.family

    def forward(hidden_states: torch.Tensor, *args, **kwargs):  # a block-held bias: read by the family itself
        return family.router_output(layer, family.select(layer, family.router_logits(layer, hidden_states), mask))

    previous = router.__dict__.get("forward")
    router.forward = forward
    try:
        yield
    finally:
        del router.forward
        if previous is not None:
            router.forward = previous


def _kl_per_token(full_logprobs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(p_full || p) per position, float64."""
    logprobs = torch.log_softmax(logits.double(), dim=-1)
    return (full_logprobs.exp() * (full_logprobs - logprobs)).sum(dim=-1)


@torch.no_grad()
def ground_truth_kl(model: nn.Module, batches: Iterable[Mapping[str, Any]], subsets: Iterable[str] = ("all",),
                    expert_chunk: int = 8, progress: bool = True) -> CalibrationStats:
    """LM-head KL from removing each expert of each MoE layer alone (MAEP App. I), as ``raw("kl", subset)``."""
    chunk = strict_int(expert_chunk)  # a Python or NumPy int, never a bool or a float
    if chunk is None or chunk < 1:
        raise ValueError(f"expert_chunk must be >= 1, got {expert_chunk!r}")
    expert_chunk = chunk
    family = get_family(model)
    layers = find_moe_layers(model)
    vision_ids = tuple(family.vision_token_ids())
    subsets = check_subsets(subsets, vision_ids)
    device = next(model.parameters()).device
    batches = [{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in batches]
    if not batches:
        raise ValueError("empty calibration set: no batches were given")
    sums = {(s, l.index): torch.zeros(l.num_experts, dtype=torch.float64, device=device)
            for s in subsets for l in layers}
    samples = {s: 0 for s in subsets}
    chunks = [(l, first) for l in layers for first in range(0, l.num_experts, expert_chunk)]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(batches) * len(chunks), desc="ground-truth KL", unit="forward", leave=False)
    for batch in batches:
        batch = model_inputs(batch)
        masks = base_masks(batch, vision_ids)
        bsz, seq = masks["all"].shape
        full = torch.log_softmax(model(**batch).logits.double(), dim=-1)
        for s in subsets:
            samples[s] += int((masks[s].sum(dim=1) > 0).sum())
        for layer, first in chunks:
            experts = list(range(first, min(first + expert_chunk, layer.num_experts)))
            with _row_masked(layer, experts, bsz * seq):
                logits = model(**_repeat(batch, len(experts))).logits
            kl = _kl_per_token(full.repeat(len(experts), 1, 1), logits).view(len(experts), bsz, seq)
            for s in subsets:
                m = masks[s].double()
                count = m.sum(dim=1)                                          # [B]
                per_sample = (kl * m).sum(dim=2) / count.clamp_min(1)         # [J, B]
                sums[(s, layer.index)][first:first + len(experts)] += (per_sample * (count > 0)).sum(dim=1)
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    values = {("kl", s): {l.index: sums[(s, l.index)] / max(samples[s], 1) for l in layers} for s in subsets}
    for s in subsets:
        if samples[s] == 0:
            raise ValueError(f"no tokens of subset {s!r} in the ground-truth batches")
    return CalibrationStats(values, {l.index: l.limits for l in layers}, samples=samples,
                            metadata={"batches": len(batches), "what": "LM-head KL per removed expert"})


def _rhos(a: Mapping[int, torch.Tensor], b: Mapping[int, torch.Tensor]) -> dict[str, Any]:
    per_layer = {str(l): spearman(a[l], b[l]) for l in sorted(a) if l in b}
    finite = [v for v in per_layer.values() if math.isfinite(v)]
    return {"per_layer": {k: (v if math.isfinite(v) else None) for k, v in per_layer.items()},
            "mean": sum(finite) / len(finite) if finite else None}


def proxy_correlations(stats: CalibrationStats, truth: CalibrationStats,
                       proxies: Iterable[str] = ("delta_h", "reap", "routing_kl")) -> dict[str, Any]:
    """``{subset: {proxy: {"per_layer": {layer: rho}, "mean": rho}}}``: Spearman of each proxy's raw
    values against the ground-truth KL, per layer (NaN -> None where a ranking is constant)."""
    out: dict[str, Any] = {}
    for subset in truth.subsets:
        gt = truth.raw("kl", subset)
        out[subset] = {p: _rhos(stats.raw(p, subset), gt) for p in proxies if stats.has(p, subset)}
    return out


def ranking_stability(stats_a: CalibrationStats, stats_b: CalibrationStats, criterion: str = "delta_h",
                      subsets: Iterable[str] | None = None) -> dict[str, Any]:
    """``{subset: {"per_layer": {layer: rho}, "mean": rho}}``: Spearman between two calibration sets."""
    subsets = tuple(subsets) if subsets is not None else tuple(s for s in stats_a.subsets if s in stats_b.subsets)
    return {s: _rhos(stats_a.raw(criterion, s), stats_b.raw(criterion, s)) for s in subsets}


def plot_correlations(correlations: Mapping[str, Any], path) -> None:
    """PNG: per-layer rho of each proxy against the ground truth, one panel per subset."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    subsets = list(correlations)
    fig, axes = plt.subplots(1, len(subsets), figsize=(4.5 * len(subsets), 3.2), squeeze=False)
    for ax, subset in zip(axes[0], subsets):
        for proxy, result in correlations[subset].items():
            layers = [int(l) for l in result["per_layer"]]
            rhos = [float("nan") if v is None else v for v in result["per_layer"].values()]
            label = f"{proxy} (mean {result['mean']:.2f})" if result["mean"] is not None else proxy
            ax.plot(layers, rhos, marker="o", label=label)
        ax.set_title(f"{subset} tokens")
        ax.set_xlabel("MoE layer")
        ax.set_ylabel("Spearman rho vs LM-head KL")
        ax.set_ylim(-1.05, 1.05)
        ax.axhline(0, color="#999", lw=0.5)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

"""MAEP's closed-form alpha with its uncertainty: a percentile bootstrap over the calibration samples.

The closed form ("Modality-Aware Expert Pruning for MoE-Based Multimodal Large Language Models", arXiv 2611.05927,
section 5.3) is alpha = a / (a + b), a = rho(t, v) - rho(t, la), b = rho(v, la), each rho the Spearman correlation
of two subsets' Delta-H over one layer's experts, averaged over the MoE layers. Delta-H per subset is a mean over the
calibration samples that have tokens of the subset (of each sample's mean over those tokens), so it is a function of
which samples were drawn: `alpha_interval` observes every sample alone (its Delta-H on ``text``, ``vision``
and ``vision_low_attn``), then recomputes a, b and alpha on ``resamples`` resamples of the samples drawn with
replacement (each resample's Delta-H = the mean over its samples that have the subset's tokens, as
[`lightprune.collect_expert_stats`][lightprune.experts.calibration.collect.collect_expert_stats] would give on those
samples), and reports the percentile intervals, per
layer too. With every sample once the figures are the closed form on the whole set
([`lightprune.experts.maep.maep_alpha`][lightprune.experts.maep.maep_alpha]; a test holds them equal, and each
resample's to a pass over its samples).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from tqdm.auto import tqdm

from lightprune.quality.intervals import percentile_interval

__all__ = ["SUBSETS", "alpha_interval", "bootstrap_alpha", "sample_delta_h"]

#: the subsets the closed form reads: text, the whole picture, the low-attention vision tokens
SUBSETS: tuple[str, str, str] = ("text", "vision", "vision_low_attn")


def sample_delta_h(model: torch.nn.Module, batches: Iterable[Mapping[str, Any]], *, low_attn_quantile: float = 0.02,
                   progress: bool = True) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """``(values [S, 3, L, E], present [S, 3], layers)``: each one-sample batch's Delta-H per subset of
    `SUBSETS`, MoE layer and expert, and whether the sample has tokens of the subset (a text-only row has no
    vision tokens). A batch of more than one sample is refused: its samples' values would be summed."""
    import lightprune as lp
    from lightprune.observe.attention_probe import modality_masks
    from lightprune.width.layers import vision_token_ids

    ids = vision_token_ids(model)
    values, present, layers = [], [], None
    for i, batch in enumerate(tqdm(list(batches), desc="alpha: samples", disable=not progress)):
        rows = int(batch["input_ids"].shape[0])
        if rows != 1:
            raise ValueError(f"alpha_interval observes one sample at a time; batch {i} has {rows} rows")
        has_vision = bool(modality_masks(batch["input_ids"], batch.get("attention_mask"), ids)[1].any())
        subsets = SUBSETS if has_vision else SUBSETS[:1]  # a text row: no vision subset to observe
        stats = lp.collect_expert_stats(model, [batch], subsets=subsets, low_attn_quantile=low_attn_quantile,
                                        criteria=("delta_h",), progress=False)
        text = stats.raw("delta_h", "text")
        layers = layers or sorted(text)
        per_subset = [[torch.as_tensor(stats.raw("delta_h", subset)[l] if subset in subsets else text[l] * 0)
                       .double() for l in layers] for subset in SUBSETS]
        values.append(torch.stack([torch.stack(v) for v in per_subset]))
        present.append(torch.tensor([True, has_vision, has_vision]))
    if not values:
        raise ValueError("alpha_interval needs at least one calibration sample")
    return torch.stack(values), torch.stack(present), list(layers)


def _average_ranks(x: torch.Tensor) -> torch.Tensor:
    """Average ranks (1-based, ties share their mean rank) along the last dimension."""
    below = (x.unsqueeze(-1) > x.unsqueeze(-2)).sum(-1).double()
    ties = (x.unsqueeze(-1) == x.unsqueeze(-2)).sum(-1).double()
    return below + (ties + 1) / 2


def _spearman(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Spearman rho along the last dimension (NaN where either side is constant)."""
    rx, ry = _average_ranks(x), _average_ranks(y)
    rx, ry = rx - rx.mean(-1, keepdim=True), ry - ry.mean(-1, keepdim=True)
    den = (rx.pow(2).sum(-1) * ry.pow(2).sum(-1)).sqrt()
    return torch.where(den > 0, (rx * ry).sum(-1) / den, torch.full_like(den, math.nan))


def bootstrap_alpha(values: torch.Tensor, present: torch.Tensor, counts: torch.Tensor) -> dict[str, torch.Tensor]:
    """a, b, alpha [B] and per layer a, b [B, L] for each row of ``counts`` [B, S] (how often each sample is in
    a resample): each subset's Delta-H the mean over the resample's samples that have its tokens, rho per layer,
    a layer left out of the means where one of its rhos is NaN (as
    [`lightprune.experts.maep.maep_alpha`][lightprune.experts.maep.maep_alpha] does)."""
    weight = counts.double().unsqueeze(-1) * present.double().unsqueeze(0)         # [B, S, 3]
    total = weight.sum(1)                                                          # [B, 3]
    means = torch.einsum("bsk,skle->bkle", weight, values.double()) / total.clamp_min(1)[:, :, None, None]
    t, v, la = means[:, 0], means[:, 1], means[:, 2]                               # [B, L, E]
    rho_tv, rho_tla, rho_vla = _spearman(t, v), _spearman(t, la), _spearman(v, la)  # [B, L]
    used = ~(rho_tv.isnan() | rho_tla.isnan() | rho_vla.isnan())
    layers_used = used.sum(-1).double()

    def mean(r: torch.Tensor) -> torch.Tensor:
        return torch.where(used, r, 0.0).sum(-1) / layers_used

    a = mean(rho_tv) - mean(rho_tla)
    b = mean(rho_vla)
    return {"a": a, "b": b, "alpha": a / (a + b), "a_per_layer": rho_tv - rho_tla, "b_per_layer": rho_vla}


def _interval(draws: torch.Tensor, level: float) -> list[float | None]:
    """The percentile interval of the finite draws (None ends when none is finite)."""
    return [x if math.isfinite(x) else None for x in percentile_interval(draws, level)]


def _num(x: torch.Tensor) -> float | None:
    value = float(x)
    return value if math.isfinite(value) else None


def alpha_interval(model: torch.nn.Module, batches: Iterable[Mapping[str, Any]], *, resamples: int = 1000,
                   level: float = 0.95, seed: int = 0, low_attn_quantile: float = 0.02,
                   progress: bool = True) -> dict[str, Any]:
    """MAEP's a, b and closed-form alpha on the one-sample ``batches`` with percentile bootstrap intervals over the
    samples (module docstring): ``{"samples", "resamples", "level", "seed", "a", "a_ci", "b", "b_ci", "alpha",
    "alpha_ci", "a_excludes_zero", "layers": {layer: {"a", "a_ci", "b", "b_ci"}}}``. alpha's interval is over the
    resamples where it is defined (a + b != 0)."""
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 2:
        raise ValueError(f"resamples must be an int >= 2, got {resamples!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    values, present, layers = sample_delta_h(model, batches, low_attn_quantile=low_attn_quantile,
                                             progress=progress)
    samples = values.shape[0]
    point = bootstrap_alpha(values, present, torch.ones(1, samples))
    index = torch.randint(0, samples, (resamples, samples), generator=torch.Generator().manual_seed(seed))
    counts = torch.zeros(resamples, samples).scatter_add_(1, index, torch.ones(resamples, samples))
    draws = bootstrap_alpha(values, present, counts)
    a_ci = _interval(draws["a"], level)
    out: dict[str, Any] = {"samples": samples, "resamples": resamples, "level": level, "seed": seed,
                           "low_attn_quantile": low_attn_quantile}
    for name in ("a", "b", "alpha"):
        out[name], out[f"{name}_ci"] = _num(point[name][0]), _interval(draws[name], level)
    out["a_excludes_zero"] = a_ci[0] is not None and (a_ci[0] > 0 or a_ci[1] < 0)
    out["layers"] = {str(layer): {name: value for term in ("a", "b") for name, value in (
        (term, _num(point[f"{term}_per_layer"][0, i])),
        (f"{term}_ci", _interval(draws[f"{term}_per_layer"][:, i], level)))} for i, layer in enumerate(layers)}
    return out

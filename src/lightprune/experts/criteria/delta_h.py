"""Delta-H: how much removing one expert changes the layer's output (MAEP ("Modality-Aware Expert Pruning for
MoE-Based Multimodal Large Language Models", arXiv 2611.05927), section 5.1, Eq. 2).

The block's routed output is H = sum_s w_s f_s over the selected experts S. Removing expert j gives a new selection
S', w'; the survivors keep their outputs and a promoted expert (in S' but not S) adds nothing. With
D_s = w_s - sum_{s' : S'_s' = S_s} w'_s' the change is H - H^(-j) = sum_s D_s f_s, so

    ||H - H^(-j)||^2 = D^T G D,   G = f f^T [T, k, k] (the batch's Gram matrix, computed once):

no expert runs again and no [T, E, H] tensor is formed. S', w' come from the family's
[`RemovalEffect`][lightprune.models.base.RemovalEffect], in order of precedence (later kinds overwrite earlier ones):

- growth 1 + g for any j (g = 0 for a renormalised router, p_j / (1 - p_j) for a plain softmax):
  ||H - H^(-j)||^2 = g^2 ||H||^2 with ||H||^2 = w^T G w;
- a closed-form swap for a selected j: the others scaled by 1 + factor, one expert entering: D = (w_s (-factor) for
  s != r, w_r), batched over [T, k];
- the re-run pairs (`lightprune.experts.calibration.reruns`): the family's selection with j masked, a chunk of
  pairs at a time.

Per sample, the mean over the sample's subset tokens; summed over the samples that have such tokens (the value is
divided by that sample count when read).

``delta_h_promoted`` also evaluates the promoted experts: ||sum_s D_s f_s - sum_p w'_p f_p(h)||^2. A swap's
entering expert is the same whichever selected expert leaves, so it runs once per token, and the square is expanded:
D^T G D - 2 w' D . (f . f_n) + w'^2 ||f_n||^2; a re-run pair's entering experts run once per distinct (token,
expert), also when a swap of the same token promotes the same expert (the batch asks the forward's own expert call
for them: `extra_rows`).

Higher is kept, except on ``vision_low_attn``: MAEP prunes the experts with the largest Delta-H on low-attention
vision tokens first (section 5.3: s = (1 - alpha) z_text - alpha z_low), so there importance is the negated value.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from lightprune.experts.criteria.from_data import CalibrationCriterion
from lightprune.experts.criteria.registry import register_criterion
from lightprune.experts.criteria.statistic import CHUNK_ELEMENTS, Statistic, SubsetCounts
from lightprune.models import MoELayer
from lightprune.observe.experts_impl import expert_rows

__all__ = ["DeltaHSums", "STATISTIC", "DeltaH", "DeltaHPromoted", "removal_values"]


class _Entering(NamedTuple):
    """The outputs of a batch's distinct entering (token, expert) pairs [pairs, H], each pair's token and rank among
    its token's pairs, and the most pairs of one token."""

    outputs: torch.Tensor
    token: torch.Tensor
    rank: torch.Tensor
    slots: int


def _put(out: torch.Tensor, tokens: torch.Tensor, experts: torch.Tensor, alias: torch.Tensor | None, pairs: slice,
         values: torch.Tensor) -> None:
    """out[tokens, experts] = values, and the same at the pairs' aliases (``alias[pairs]``, -1 none)."""
    out[tokens, experts] = values
    if alias is not None:
        alias = alias[pairs].to(out.device)
        has = alias >= 0
        out[tokens[has], alias[has]] = values[has]


def _growth(batch) -> torch.Tensor:
    """dh [T, E] of the growth: g^2 ||H||^2 (zeros when the family has none)."""
    num_tokens, num_experts = batch.logits.shape
    w, device = batch.w, batch.hidden.device
    if batch.effect.growth is None:
        return torch.zeros(num_tokens, num_experts, dtype=w.dtype, device=device)
    norm2 = torch.einsum("ts,tsr,tr->t", w, batch.gram, w)                 # ||H_t||^2
    return batch.effect.growth.to(device=device, dtype=w.dtype).pow(2) * norm2.unsqueeze(-1)


def _swaps(batch, dh: torch.Tensor, dhp: torch.Tensor | None) -> None:
    """The closed-form swaps of each token's selected experts, into dh (and the promoted variant)."""
    layer, effect, w, f, gram = batch.layer, batch.effect, batch.w, batch.f, batch.gram
    dtype, device = w.dtype, batch.hidden.device
    k = batch.selected.shape[1]
    factor = effect.swap_factor.to(device=device, dtype=dtype)
    eye = torch.eye(k, dtype=torch.bool, device=device)
    diff = torch.where(eye, w.unsqueeze(1), -w.unsqueeze(1) * factor.unsqueeze(-1))   # D [T, r, s]
    ids = batch.selected.to(device)
    quad = ((diff @ gram) * diff).sum(dim=-1)                                # D^T G D  [T, k]
    dh.scatter_(1, ids, quad)
    if dhp is None:
        return
    # ||sum_s D_s f_s - w' f_n||^2 = D^T G D - 2 w' D . (f_s . f_n) + w'^2 ||f_n||^2: f_n once per token
    tokens = torch.arange(w.shape[0], device=device)
    f_n = batch.swap_outputs if batch.swap_outputs is not None else \
        layer.family.selected_rows(layer, batch.hidden, tokens, effect.swap_expert.to(device), expert_rows).to(dtype)
    cross = torch.bmm(f, f_n.unsqueeze(-1)).squeeze(-1)                     # f_s . f_n  [T, k]
    weight = effect.swap_weight.to(device=device, dtype=dtype) * layer.family.output_scale(layer)
    value = quad - 2 * weight * (diff @ cross.unsqueeze(-1)).squeeze(-1) \
        + weight.pow(2) * f_n.pow(2).sum(dim=-1, keepdim=True)
    dhp.scatter_(1, ids, value.clamp_min(0))


def _entering(batch) -> _Entering | None:
    """The re-run pairs' entering outputs (run here when the forward did not), None without any."""
    reruns, device = batch.reruns, batch.hidden.device
    if not reruns.pair_token.numel():
        return None
    outputs = batch.rerun_outputs
    if outputs is None:
        outputs = batch.layer.family.selected_rows(batch.layer, batch.hidden, reruns.pair_token.to(device),
                                                   reruns.pair_expert.to(device), expert_rows).to(batch.dtype)
    # the distinct entering outputs of each token, densely [T, slots, H]: their dot products with the token's selected
    # outputs and with each other are batched per token (no [pairs, k, H] gather)
    token = reruns.pair_token.to(device)
    per_token = torch.bincount(token, minlength=batch.w.shape[0])
    rank = torch.arange(token.numel(), device=device) - (per_token.cumsum(0) - per_token)[token]
    return _Entering(outputs, token, rank, int(per_token.max()))


def _rerun_chunk(batch, dh: torch.Tensor, dhp: torch.Tensor | None, tokens: torch.Tensor,
                 pairs: slice, t0: int, t1: int, entering: _Entering | None) -> None:
    """The re-run pairs ``pairs`` (those of tokens t0..t1; ``tokens``: every pair's token, on the outputs' device)
    into dh (and the promoted variant)."""
    reruns, w, device = batch.reruns, batch.w, batch.hidden.device
    dtype = w.dtype
    t, j = tokens[pairs], reruns.experts[pairs].to(device)
    w_new = reruns.weights[pairs].to(device=device, dtype=dtype) * batch.layer.family.output_scale(batch.layer)
    match = reruns.selected[pairs].to(device).unsqueeze(2) == batch.selected.index_select(0, t).unsqueeze(1)
    diff = w.index_select(0, t) - torch.einsum("np,nps->ns", w_new, match.to(dtype))     # D [n, k]
    quad = torch.einsum("ns,nsr,nr->n", diff, batch.gram.index_select(0, t), diff)       # D^T G D
    _put(dh, t, j, reruns.alias, pairs, quad)
    if dhp is None:
        return
    # ||sum_s D_s f_s - sum_p a_p f_p||^2 = D^T G D - 2 D^T C a + a^T P a, with the entering outputs f_p, their
    # weights a, C = f_s . f_p and P = f_p . f_q
    first, last = pairs.start, pairs.stop
    e0, e1 = torch.searchsorted(reruns.row, torch.tensor([first, last], device=reruns.row.device)).tolist()
    value = quad
    if e1 > e0:
        slots, width = entering.slots, batch.f.shape[-1]
        row, col = reruns.row[e0:e1].to(device) - first, reruns.col[e0:e1].to(device)
        a = torch.zeros(last - first, slots, dtype=dtype, device=device)
        a[row, entering.rank[reruns.inverse[e0:e1].to(device)]] = w_new[row, col]
        p0, p1 = torch.searchsorted(entering.token, torch.tensor([t0, t1], device=device)).tolist()
        outputs = torch.zeros(t1 - t0, slots, width, dtype=dtype, device=device)
        outputs[entering.token[p0:p1] - t0, entering.rank[p0:p1]] = entering.outputs[p0:p1]
        cross = torch.bmm(batch.f[t0:t1], outputs.transpose(1, 2)).index_select(0, t - t0)  # C [n, k, slots]
        among = torch.bmm(outputs, outputs.transpose(1, 2)).index_select(0, t - t0)         # P [n, slots, slots]
        value = quad - 2 * torch.einsum("ns,nsm,nm->n", diff, cross, a) + torch.einsum("nm,nmq,nq->n", a, among, a)
    _put(dhp, t, j, reruns.alias, pairs, value.clamp_min(0))


def removal_values(batch, promoted: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """||H - H^(-j)||^2 per token and expert [T, E] in the compute dtype, and with ``promoted`` the variant that
    includes the promoted experts (see the module docstring)."""
    dh = _growth(batch)
    dhp = dh.clone() if promoted else None
    if batch.effect.swap_factor is not None:
        _swaps(batch, dh, dhp)
    tokens = batch.reruns.tokens.to(batch.hidden.device)
    if not tokens.numel():
        return dh, dhp
    entering = _entering(batch) if promoted else None
    slots, k, width = (entering.slots if entering else 0), batch.selected.shape[1], batch.f.shape[-1]
    step = max(1, CHUNK_ELEMENTS // (max(k, slots) * (width if slots else k)))   # tokens per chunk
    for t0 in range(0, batch.w.shape[0], step):
        t1 = min(batch.w.shape[0], t0 + step)
        first, last = torch.searchsorted(tokens, torch.tensor([t0, t1], device=tokens.device)).tolist()
        if first != last:
            _rerun_chunk(batch, dh, dhp, tokens, slice(first, last), t0, t1, entering)
    return dh, dhp


class DeltaHSums(Statistic):
    """Delta-H (and its promoted variant) per expert and subset: the sum over samples of each sample's mean
    ||H - H^(-j)||^2 over its subset tokens; the value is divided by the samples that had such tokens."""

    values = ("delta_h", "delta_h_promoted")

    def __init__(self, layer: MoELayer, subsets: tuple[str, ...], wanted: tuple[str, ...],
                 counts: SubsetCounts | None = None):
        super().__init__(layer, subsets, wanted, counts)
        self.sums = {name: self.zeros(len(subsets), layer.num_experts) for name in self.wanted}

    @property
    def needs(self) -> frozenset[str]:
        return frozenset({"logits", "removal"} | ({"entering"} if "delta_h_promoted" in self.wanted else set()))

    def update(self, batch) -> None:
        dh, dhp = removal_values(batch, "delta_h_promoted" in self.wanted)
        weight, num = batch.sample_weight, self.num_experts                 # [U, T]; identity experts' columns
        if "delta_h" in self.sums:                                           # dropped
            self.sums["delta_h"] += (weight @ dh[:, :num]).double()
        if dhp is not None:
            self.sums["delta_h_promoted"] += (weight @ dhp[:, :num]).double()

    def value(self, name: str, subset: int | None) -> torch.Tensor:
        return self.sums[name][subset] / self.counts.samples(subset).clamp_min(1)


#: what the observed pass accumulates for these criteria
STATISTIC = DeltaHSums


@register_criterion("delta_h")
class DeltaH(CalibrationCriterion):
    """Delta-H (MAEP eq. 2): the mean over samples of each sample's mean ||H - H^(-j)||^2 over its subset tokens;
    negated on ``vision_low_attn``."""

    statistic = "delta_h"
    negated = frozenset({"vision_low_attn"})


@register_criterion("delta_h_promoted")
class DeltaHPromoted(CalibrationCriterion):
    """Delta-H with the promoted experts' outputs included in H^(-j) (collected when asked for); negated on
    ``vision_low_attn``."""

    statistic = "delta_h_promoted"
    negated = frozenset({"vision_low_attn"})

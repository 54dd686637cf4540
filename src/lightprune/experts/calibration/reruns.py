"""The re-run selections of a removal effect: for each (token, expert) pair whose removal has no closed form, the
family's selection without that expert, and the experts that enter it (MAEP eq. 2, the pairs of
`rerun`).

The family computes them where it can (``RemovalEffect.rerun_selected``), else
[`select_without`][lightprune.models.base.MoEFamily.select_without] re-runs its selection from the same router logits, a
chunk of pairs per
call (bounded memory: rows x E logits). The distinct (token, expert) pairs that enter are what the promoted Delta-H
runs once each.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightprune.experts.criteria.statistic import CHUNK_ELEMENTS
from lightprune.models import MoELayer, RemovalEffect

__all__ = ["Reruns", "reselect"]


@dataclass(eq=False)
class Reruns:
    """A [`RemovalEffect`][]'s re-run pairs (``tokens``, ``experts``, sorted by token) with their new selections
    (``weights`` before the family's output scale, ``selected``), and the distinct (token, expert) pairs that enter
    (``pair_token``, ``pair_expert``; slot (``row``, ``col``) of the new selections holds pair ``inverse``);
    ``alias``: a second removed expert per pair with the same effect (-1 none), or None."""

    tokens: torch.Tensor
    experts: torch.Tensor
    alias: torch.Tensor | None
    weights: torch.Tensor
    selected: torch.Tensor
    row: torch.Tensor
    col: torch.Tensor
    pair_token: torch.Tensor
    pair_expert: torch.Tensor
    inverse: torch.Tensor


def _select_without(layer: MoELayer, logits: torch.Tensor, tokens: torch.Tensor, experts: torch.Tensor,
                    k: int, selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, selected) of the family's selection without each pair's expert, a chunk of pairs per call."""
    step = max(1, CHUNK_ELEMENTS // logits.shape[-1])
    weights, chosen = [], []
    for start in range(0, tokens.numel(), step):
        _, w_new, s_new = layer.family.select_without(layer, logits, tokens[start:start + step],
                                                      experts[start:start + step])
        weights.append(w_new)
        chosen.append(s_new)
    return (torch.cat(weights) if weights else logits.new_zeros(0, k),
            torch.cat(chosen) if chosen else selected.new_zeros(0, k))


def reselect(layer: MoELayer, logits: torch.Tensor, selected: torch.Tensor, effect: RemovalEffect,
             entering: bool) -> Reruns:
    """The family's selection without each re-run pair's expert (the effect's own, else ``select_without``), and
    with ``entering`` the distinct (token, expert) pairs that enter (none without). A family whose removals all have
    a closed form (no re-run slots: ``effect.rerun`` [T, 0]) gets empty pairs without a host sync; otherwise how many
    pairs there are is read (it sizes the selections re-run and the rows the promoted Delta-H runs)."""
    if effect.rerun.shape[1] == 0:
        none = effect.rerun.new_zeros(0, dtype=torch.long).to(logits.device)
        k = selected.shape[1]
        return Reruns(tokens=none, experts=none, alias=None if effect.rerun_alias is None else none,
                      weights=logits.new_zeros(0, k), selected=selected.new_zeros(0, k), row=none, col=none,
                      pair_token=none, pair_expert=none, inverse=none)
    t_all, slot = (effect.rerun >= 0).nonzero(as_tuple=True)
    flat = t_all * effect.rerun.shape[1] + slot

    def at(tensor: torch.Tensor) -> torch.Tensor:  # tensor[t_all, slot], by index_select (faster on a CPU)
        return tensor.flatten(0, 1).index_select(0, flat.to(tensor.device)).to(logits.device)

    j_all, t_all = at(effect.rerun), t_all.to(logits.device)
    alias = None if effect.rerun_alias is None else at(effect.rerun_alias)
    k = selected.shape[1]
    if effect.rerun_selected is not None:
        w_new, s_new = at(effect.rerun_weights), at(effect.rerun_selected)
    else:
        w_new, s_new = _select_without(layer, logits, t_all, j_all, k, selected)
    if entering:
        is_new = ~(s_new.unsqueeze(2) == selected.index_select(0, t_all).unsqueeze(1)).any(dim=2)  # [n, k'] entering
        row, col = is_new.nonzero(as_tuple=True)
    else:
        row = col = t_all[:0]
    num_experts = layer.num_selectable  # a re-run may select an identity expert
    entered = s_new.reshape(-1).index_select(0, row * s_new.shape[1] + col)
    pair, inverse = torch.unique(t_all.index_select(0, row) * num_experts + entered, return_inverse=True)
    return Reruns(tokens=t_all, experts=j_all, alias=alias, weights=w_new, selected=s_new, row=row, col=col,
                  pair_token=pair // num_experts, pair_expert=pair % num_experts, inverse=inverse)

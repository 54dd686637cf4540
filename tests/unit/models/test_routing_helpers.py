"""The routing helpers the families share, against the expressions they replace (bitwise) and DeepSeek-V3's rule
against its formula: the renormalisation, the unchosen groups' fill, the rule's three starting points."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lightprune.models.deepseek_v3_routing import (
    mask_unchosen_groups,
    select_from_group_top,
    select_from_scores,
    select_without_one,
)
from lightprune.models.routing_ops import fill_unchosen_groups, renormalized


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("eps", [None, 1e-20, 1e-6])
def test_renormalized_is_the_inline_expression_bitwise(dtype, eps) -> None:
    gen = torch.Generator().manual_seed(0)
    weights = torch.rand(64, 8, generator=gen).to(dtype)
    weights[3] = 0.0                                            # a zero row: 0 / eps, or NaN without one
    weights[5, :4] = 1e-30
    inline = weights / (weights.sum(dim=-1, keepdim=True) + eps) if eps is not None else \
        weights / weights.sum(dim=-1, keepdim=True)
    in_place = weights.clone()
    if eps is None:
        in_place /= in_place.sum(dim=-1, keepdim=True)
    else:
        in_place /= in_place.sum(dim=-1, keepdim=True) + eps
    got = renormalized(weights, eps)
    assert got.dtype == dtype and torch.equal(_bits(got), _bits(inline)) and torch.equal(_bits(got), _bits(in_place))
    assert torch.equal(_bits(weights), _bits(weights.clone()))  # out of place


def _old_group_mask(group_scores: torch.Tensor, topk_group: int, num_experts: int) -> torch.Tensor:
    """The [T, E] mask of the chosen groups' experts as the DeepSeek routers build it (expanded, then bool)."""
    num_group = group_scores.shape[-1]
    group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    return group_mask.unsqueeze(-1).expand(-1, num_group, num_experts // num_group).reshape(-1, num_experts).bool()


@pytest.mark.parametrize("fill", [float("-inf"), 0.0])
def test_fill_unchosen_groups_is_the_routers_masked_fill(fill) -> None:
    gen = torch.Generator().manual_seed(1)
    values = torch.randn(50, 32, generator=gen)
    values[::7, ::5] = float("nan")
    values[::3, 2] = float("inf")
    values[1::4, 9] = float("-inf")
    groups = values.view(-1, 8, 4).nan_to_num(0.0).amax(dim=-1)
    chosen = torch.topk(groups, k=3, dim=-1, sorted=False)[1]
    expected = values.masked_fill(~_old_group_mask(groups, 3, 32), fill)
    got = fill_unchosen_groups(values, chosen, 8, fill)
    assert got.is_contiguous() and torch.equal(_bits(got), _bits(expected))
    finite = torch.randn(50, 32, generator=gen)
    assert torch.equal(_bits(mask_unchosen_groups(finite, chosen, 8, finite=True)),
                       _bits(mask_unchosen_groups(finite, chosen, 8, finite=False)))


def _router(num_experts: int, num_group: int, topk_group: int, top_k: int, norm: bool, seed: int = 2):
    gen = torch.Generator().manual_seed(seed)
    return SimpleNamespace(num_group=num_group, topk_group=topk_group, top_k=top_k, norm_topk_prob=norm,
                           routed_scaling_factor=2.5, e_score_correction_bias=torch.randn(num_experts, generator=gen))


def _by_the_formula(router, logits: torch.Tensor, token: int) -> dict[int, float]:
    """{expert: weight} of one token, from the module docstring's formula in plain Python (float64)."""
    s = torch.sigmoid(logits[token].double()).tolist()
    c = [x + b for x, b in zip(s, router.e_score_correction_bias.double().tolist())]
    size = len(c) // router.num_group
    group = [sum(sorted(c[g * size:(g + 1) * size], reverse=True)[:2]) for g in range(router.num_group)]
    chosen = sorted(range(router.num_group), key=lambda g: -group[g])[:router.topk_group]
    pool = [e for e in range(len(c)) if e // size in chosen]
    picked = sorted(pool, key=lambda e: -c[e])[:router.top_k]
    total = sum(s[e] for e in picked) + 1e-20 if router.norm_topk_prob else 1.0
    return {e: s[e] / total * router.routed_scaling_factor for e in picked}


@pytest.mark.parametrize("shape,norm", [((64, 8, 3, 6), True), ((32, 4, 2, 4), False), ((16, 8, 4, 3), True)],
                         ids=["64-8-3-6", "32-4-2-4-no-norm", "16-8-4-3"])
def test_deepseek_v3_rule_from_each_start(shape, norm) -> None:
    """The rule from all E scores equals the formula; read off the group top lists it is the same tensors; with one
    expert removed per row it is the all-E rule on a one-hot mask (as sets: the order may differ)."""
    num_experts, num_group, topk_group, top_k = shape
    router = _router(num_experts, num_group, topk_group, top_k, norm)
    logits = torch.randn(12, num_experts, generator=torch.Generator().manual_seed(3)) * 2
    _, weights, selected = select_from_scores(router, logits, None)
    for token in range(logits.shape[0]):
        expected = _by_the_formula(router, logits, token)
        got = dict(zip(selected[token].tolist(), weights[token].tolist()))
        assert set(got) == set(expected), token
        assert all(abs(got[e] - w) <= 1e-6 * max(1.0, abs(w)) for e, w in expected.items()), token
    observed_weights, observed, top = select_from_group_top(router, logits)
    assert torch.equal(observed, selected) and torch.equal(_bits(observed_weights), _bits(weights))
    assert top.scores is not None and top.chosen is not None and top.values.shape[:2] == (12, num_group)
    tokens = torch.arange(logits.shape[0]).repeat_interleave(num_experts)
    experts = torch.arange(num_experts).repeat(logits.shape[0])
    one_hot = torch.zeros(tokens.numel(), num_experts, dtype=torch.bool)
    one_hot[torch.arange(tokens.numel()), experts] = True
    w_without, s_without, short = select_without_one(router, logits, tokens, experts)
    _, w_masked, s_masked = select_from_scores(router, logits[tokens], one_hot)
    keep = ~short
    order_got, order_exp = s_without[keep].argsort(dim=-1), s_masked[keep].argsort(dim=-1)
    assert torch.equal(s_without[keep].gather(1, order_got), s_masked[keep].gather(1, order_exp))
    torch.testing.assert_close(w_without[keep].gather(1, order_got), w_masked[keep].gather(1, order_exp),
                               rtol=1e-6, atol=1e-7)

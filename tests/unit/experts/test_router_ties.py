"""Exact ties in router logits: the masked model selects what the structurally pruned model's own router selects.

``torch.topk`` breaks ties by position in a tensor of a given size, so a selection over all E columns with the removed
experts at -inf can pick other experts among equal scores than the pruned router's selection over its E' columns. The
masked routing runs the family's selection on the kept columns (their logits, selection biases, per-expert scales and
group layout) and maps the positions back to expert ids; these tests make every logit equal (a zero router weight,
zero selection biases) or equal in pairs of kept experts, and require the selected experts to be those of the pruned
model at every layer, and the weights bitwise where the input is the same (the first MoE layer, and every layer's
route() on one hidden state), to fp32 rounding after it (fp32).
"""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures import padded_batch

import lightprune as lp
from lightprune.experts.prune import per_expert_tensors

KEEP = [1, 3, 4, 6]  # of 8: two per group of a two-group router
#: (tied expert, the expert whose router entries it copies): pairs of kept experts, and of removed ones
PAIRS = ((3, 1), (6, 4), (2, 0), (7, 5))
#: per-expert router tensors that enter the selection scores (zeroed for all-equal scores)
SCORED = ("weight", "bias", "e_score_correction_bias", "expert_bias")

FAMILIES = [
    "qwen3_moe",      # softmax top-k, renormalised (norm_topk_prob)
    "mixtral",        # softmax of fp32 logits, top-k, renormalised, fp32 weights
    "qwen2_moe",      # softmax top-k, not renormalised
    "deepseek_v3",    # sigmoid + correction bias, group-limited top-k
    "deepseek_v2",    # softmax, group-limited greedy
    "ernie4_5_moe",   # softmax + selection bias (moe_statics), renormalised
    "gemma4_text",    # softmax, top-k, renormalised, per-expert scales; the router returns probabilities
    "gpt_oss",        # biased logits, top-k, softmax over the k
    "minimax_m2",     # sigmoid + the block's correction bias
    "laguna",         # soft-capped sigmoid + the router's correction bias
    "lfm2_moe",       # sigmoid + the block's expert bias, renormalised, scaled
    "longcat_flash",  # softmax over experts + zero-computation experts, + correction bias, unsorted top-k, scaled
]


def _tie(model, case: str) -> None:
    """Make the router scores of every MoE layer tie: all equal ("zeros") or equal in the pairs :data:`PAIRS`."""
    with torch.no_grad():
        for layer in lp.find_moe_layers(model):
            for module, name, dim, is_router, _ in per_expert_tensors(layer):
                if not is_router or name not in SCORED:
                    continue
                tensor = getattr(module, name)
                if case == "zeros":
                    tensor.zero_()
                else:
                    for tied, source in PAIRS:
                        tensor.select(dim, tied).copy_(tensor.select(dim, source))


@torch.no_grad()
def _run(model, batch) -> tuple[torch.Tensor, dict[int, tuple]]:
    """The model's logits on ``batch`` and what each MoE layer's router returned (its outputs, cloned)."""
    seen: dict[int, tuple] = {}
    handles = [layer.router.register_forward_hook(
        lambda module, args, output, index=layer.index: seen.setdefault(index, tuple(o.clone() for o in output)))
        for layer in lp.find_moe_layers(model)]
    try:
        logits = model(**batch).logits
    finally:
        for handle in handles:
            handle.remove()
    return logits, seen


@pytest.mark.parametrize("case", ["zeros", "pairs"])
@pytest.mark.parametrize("family", FAMILIES)
def test_masked_routing_breaks_ties_as_the_pruned_router(tiny, family, case) -> None:
    model = tiny(family, seed=4)
    _tie(model, case)
    layers = lp.find_moe_layers(model)
    plan = lp.ExpertPlan(keep={layer.index: KEEP for layer in layers},
                         num_experts={layer.index: layer.num_experts for layer in layers})
    batch = padded_batch(seed=3)
    with lp.mask_experts(model, plan):
        masked_logits, masked = _run(model, batch)
    pruned_model = lp.prune_experts(copy.deepcopy(model), plan)
    pruned_logits, pruned = _run(pruned_model, batch)

    kept = torch.tensor(KEEP)
    # the pruned router's rows: the kept experts', then LongCat-Flash's zero-computation experts' (ids past the 8)
    rows = torch.cat([kept, torch.arange(8, 8 + getattr(model.config, "zero_expert_num", 0))])
    assert sorted(masked) == sorted(pruned) == [layer.index for layer in layers]
    for position, layer in enumerate(layers):
        (m_first, m_weights, m_ids), (p_first, p_weights, p_ids) = masked[layer.index], pruned[layer.index]
        where = f"{family} {case} layer {layer.index}"
        assert torch.equal(m_ids, rows[p_ids]), where  # the ties are in the router's rows: exact at every layer
        # the first MoE layer sees the same input in both models: bitwise. A later one sees the output of MoE layers
        # whose expert kernels ran over 8 experts in one model and 4 in the other (tokens grouped, summed in an order
        # that may differ): the same to fp32 rounding
        same = torch.equal if position == 0 else (
            lambda a, b: bool(torch.isclose(a, b, rtol=1e-5, atol=1e-6).all()))
        assert same(m_weights, p_weights), where
        # the router's first output: the pruned one's at the kept experts, nothing at the removed ones
        assert same(m_first.index_select(-1, rows), p_first), where
        removed = torch.ones(layer.num_experts, dtype=torch.bool)
        removed[kept] = False
        fill = 0.0 if family == "gemma4_text" else float("-inf")  # Gemma 4's router returns probabilities
        assert bool((m_first[..., :layer.num_experts][..., removed] == fill).all()), where
    torch.testing.assert_close(masked_logits, pruned_logits, rtol=1e-5, atol=1e-5, msg=f"{family} {case}")

    # route() with an [E] mask (the export's layer check) selects as the pruned layer's router too
    hidden = torch.randn(7, model.config.get_text_config().hidden_size, generator=torch.Generator().manual_seed(0))
    for layer, pruned_layer in zip(layers, lp.find_moe_layers(pruned_model), strict=True):
        mask = torch.ones(layer.num_experts, dtype=torch.bool)
        mask[kept] = False
        with torch.no_grad():
            _, m_weights, m_ids = layer.route(hidden, mask)
            _, p_weights, p_ids = pruned_layer.route(hidden)
        assert torch.equal(m_ids, rows[p_ids]) and torch.equal(m_weights, p_weights), f"{family} {layer.index}"


def test_an_all_kept_mask_routes_as_the_router(tiny) -> None:
    """A mask that removes nothing runs the family's own selection on all E columns (bitwise the router)."""
    model = tiny("deepseek_v3", seed=4)
    _tie(model, "zeros")
    layer = lp.find_moe_layers(model)[0]
    hidden = torch.randn(5, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = layer.router(hidden)
        got = layer.route(hidden, torch.zeros(layer.num_experts, dtype=torch.bool))
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)

"""The conformance table's calibration and weight rows, for every family with a tiny model: frequency sums equal
tokens x top-k, Delta-H with the promoted expert (``delta_h_promoted``: the block's output with the expert removed,
the next-ranked expert promoted) equals a brute-force removal of each expert on one layer, AIMER equals its formula.

(Routing == the family's own router in fp32 and bf16 is ``tests/unit/models/test_models.py``; masked == pruned is
``tests/unit/experts/test_surgery.py``; pruned == reloaded with both loaders is ``tests/unit/export/test_export.py``:
all three are parametrised over the same :data:`TINY_FAMILIES`.)
"""

from __future__ import annotations

import math

import pytest
import torch
from fixtures import (
    INPUT_SCALING,
    MULTIMODAL,
    OUTPUT_SCALE_KEY,
    ROW_BLOCK_EXPERTS,
    config_count,
    padded_batch,
    text_config_of,
)

import lightprune as lp
from lightprune.testing.tiny import TINY_FAMILIES

TEXT_FAMILIES = tuple(f for f in TINY_FAMILIES if f not in MULTIMODAL)  # the MLLMs: own tests
#: MLLMs whose experts compute what no text family's do, so the rows run on them too (on text batches): Muse Spark's
#: experts norm each output (post_expert_norm), it has no text-only model
OWN_EXPERTS_MLLMS = ("muse_spark",)


def _batches() -> list[dict[str, torch.Tensor]]:
    return [padded_batch(seed=5, batch=2, seq=8, pad=3), padded_batch(seed=6, batch=2, seq=8, pad=0)]


@torch.no_grad()
def _router_and_expert_inputs(model, layer, batches) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per batch, what the layer's router and its experts are called with (the same tokens; in Gemma 4 the router
    sees the residual stream and the experts a normed copy)."""
    routed, expert = [], []
    handles = [layer.router.register_forward_pre_hook(lambda m, args: routed.append(args[0].detach()))]
    if layer.family.model_types[0] in INPUT_SCALING:  # Llama 4: the experts get the router's input, scaled per expert
        handles.append(layer.router.register_forward_pre_hook(lambda m, args: expert.append(args[0].detach())))
    else:
        handles.append(layer.experts.register_forward_pre_hook(lambda m, args: expert.append(args[0].detach())))
    try:
        for batch in batches:
            model(**batch)
    finally:
        for handle in handles:
            handle.remove()
    return list(zip(routed, expert, strict=True))


@torch.no_grad()
def _expert_picks(model, layers, batches) -> dict[int, int]:
    """How many (valid token, expert) picks each MoE layer's router makes over ``batches``, identity experts'
    (LongCat-Flash's zero-computation experts, ids past the experts') not counted: read from the ids it returns."""
    picks = {layer.index: 0 for layer in layers}
    valid: list[torch.Tensor] = []

    def hook(layer):
        def count(module, args, output):
            ids = output[2].reshape(-1, output[2].shape[-1])
            picks[layer.index] += int(((ids < layer.num_experts) & valid[0].reshape(-1, 1)).sum())
        return count

    handles = [layer.router.register_forward_hook(hook(layer)) for layer in layers]
    try:
        for batch in batches:
            valid[:] = [batch["attention_mask"].bool()]
            model(**batch)
    finally:
        for handle in handles:
            handle.remove()
    return picks


@torch.no_grad()
def _router_calls(model, layers, batch) -> dict[int, int]:
    """How many times each MoE layer's router runs in one forward of ``batch``."""
    calls = {layer.index: 0 for layer in layers}
    handles = [layer.router.register_forward_pre_hook(lambda m, args, i=layer.index: calls.__setitem__(i, calls[i] + 1))
               for layer in layers]
    try:
        model(**batch)
    finally:
        for handle in handles:
            handle.remove()
    return calls


@torch.no_grad()
def _routed_output(layer, inputs: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
    """The routed experts' output [T, H] (float64) with the experts in ``mask`` removed from the selection, run by the
    family's own experts module (shared experts are the same with and without the mask: they cancel)."""
    router_input, expert_input = (x.reshape(-1, x.shape[-1]) for x in inputs)
    if layer.family.model_types[0] in INPUT_SCALING:  # Llama 4: sum_j f_j(s_j x), the router's dense scores s
        scores, _ = layer.family.router_output(layer, layer.route(router_input, mask))
        routed_in = expert_input.repeat(scores.shape[1], 1) * scores.transpose(0, 1).reshape(-1, 1)
        return layer.experts(routed_in).view(scores.shape[1], *expert_input.shape).double().sum(dim=0)
    _, weights, index = layer.route(router_input, mask)
    weights = weights.to(expert_input.dtype)
    if layer.identity_experts:  # LongCat-Flash: a zero-computation expert's output is its input
        ffn = index < layer.num_experts
        identity = (weights * ~ffn).sum(dim=-1, keepdim=True).double() * expert_input.double()
        return layer.experts(expert_input, torch.where(ffn, index, 0), weights * ffn).double() + identity
    out = layer.experts(expert_input, index, weights).double()
    key = OUTPUT_SCALE_KEY.get(layer.family.model_types[0])  # a factor the block applies after the experts
    return out * getattr(layer.family.text_config, key) if key else out


@pytest.mark.parametrize("family", TEXT_FAMILIES + OWN_EXPERTS_MLLMS)
def test_calibration_and_weight_rows(tiny, family) -> None:
    model = tiny(family, seed=7)
    batches = _batches()
    stats = lp.collect_expert_stats(model, batches, subsets=("all",), criteria=("frequency", "delta_h_promoted"),
                                    progress=False)
    layers = lp.find_moe_layers(model)
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    passes = _router_calls(model, layers, batches[0])  # 1, or a looped layer's passes per forward (Inkling 2 Loop)
    # every valid token picks exactly top-k experts, in every pass through the layer; with identity experts, as many
    # of the router's picks as are experts
    picks = _expert_picks(model, layers, batches) if layers[0].identity_experts else None
    for layer in layers:
        want = tokens * layer.top_k * passes[layer.index] if picks is None else picks[layer.index]
        assert float(stats.raw("frequency", "all")[layer.index].sum()) == want
    if picks is not None:  # the zero-computation experts are picked, and not counted
        assert all(picks[layer.index] < tokens * layer.top_k for layer in layers)

    # Delta-H on the first MoE layer: remove each expert from the selection (the family's router then promotes the
    # next-ranked one, exactly as if the expert were gone) and measure the routed output's change per token
    first = layers[0]
    inputs = _router_and_expert_inputs(model, first, batches)
    expected = []
    for j in range(first.num_experts):
        mask = torch.zeros(first.num_experts, dtype=torch.bool)
        mask[j] = True
        per_sample = []
        for batch, h in zip(batches, inputs):
            shape = batch["input_ids"].shape
            change = (_routed_output(first, h, None) - _routed_output(first, h, mask)).view(*shape, -1)
            valid = batch["attention_mask"].bool()
            for row in range(valid.shape[0]):
                if valid[row].any():
                    per_sample.append(float((change[row] ** 2).sum(-1)[valid[row]].mean()))
        expected.append(sum(per_sample) / len(per_sample))
    got = stats.raw("delta_h_promoted", "all")[first.index].tolist()
    assert got == pytest.approx(expected, rel=1e-4, abs=1e-9)

    # AIMER = ||w||_1 / (sqrt(N) ||w||_2) over the expert's gate, up and down weights (AIMER ("AIMER:
    # Calibration-Free Task-Agnostic MoE Pruning", arXiv 2603.18492), eq. 5)
    aimer = lp.score_weights(model, "aimer").raw
    for layer in layers:
        for e in range(layer.num_experts):
            if family in ROW_BLOCK_EXPERTS:  # DBRX: the expert's I rows of w1, v1 and w2
                rows = config_count(text_config_of(model), ROW_BLOCK_EXPERTS[family])
                parts = [getattr(layer.experts.mlp, name)[e * rows:(e + 1) * rows] for name in ("w1", "v1", "w2")]
            else:  # ungated: up_proj
                parts = [getattr(layer.experts, name)[e] for name in ("gate_up_proj", "up_proj", "down_proj")
                         if hasattr(layer.experts, name)]
            w = torch.cat([part.detach().double().flatten() for part in parts])
            want = float(w.abs().sum()) / (math.sqrt(w.numel()) * float(w.norm()))
            assert float(aimer[layer.index][e]) == pytest.approx(want, rel=1e-6)


def _same_routing(got, expected, where: str) -> None:
    """Equal (expert, weight) sets per row: select_without may order the selected experts differently."""
    (_, w_got, s_got), (_, w_exp, s_exp) = got, expected
    order_got, order_exp = s_got.argsort(dim=-1), s_exp.argsort(dim=-1)
    assert torch.equal(s_got.gather(1, order_got), s_exp.gather(1, order_exp)), where
    torch.testing.assert_close(w_got.gather(1, order_got).float(), w_exp.gather(1, order_exp).float(),
                               rtol=1e-6, atol=1e-7, msg=lambda m: f"{where}: {m}")


@pytest.mark.parametrize("family,overrides", [(f, {}) for f in TEXT_FAMILIES] + [
    ("deepseek_v3", dict(n_routed_experts=64, n_group=8, topk_group=3, num_experts_per_tok=6)),
    ("deepseek_v3", dict(n_routed_experts=256, n_group=8, topk_group=4, num_experts_per_tok=8)),
    ("deepseek_v3", dict(n_routed_experts=16, n_group=8, topk_group=4, num_experts_per_tok=3)),  # 2 per group
    ("deepseek_v3", dict(n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=8)),  # groups full
])
def test_select_without_equals_the_masked_selection(tiny, family, overrides) -> None:
    """For every (token, expert) pair, the family's select_without equals its selection with that expert masked (the
    reference: select on a one-hot mask per row), so a family's faster form cannot drift from its router."""
    model = tiny(family, seed=3, **overrides)
    layer = lp.find_moe_layers(model)[0]
    router_input, _ = _router_and_expert_inputs(model, layer, _batches()[:1])[0]
    logits = layer.family.router_logits(layer, router_input.reshape(-1, router_input.shape[-1]))
    num_tokens, num_experts = logits.shape
    tokens = torch.arange(num_tokens).repeat_interleave(num_experts)
    experts = torch.arange(num_experts).repeat(num_tokens)
    mask = torch.zeros(tokens.numel(), num_experts, dtype=torch.bool)
    mask[torch.arange(tokens.numel()), experts] = True
    with torch.no_grad():
        got = layer.family.select_without(layer, logits, tokens, experts)
        expected = layer.family.select(layer, logits[tokens], mask)
    _same_routing(got, expected, f"{family} {overrides}")
    router = layer.router
    groups_full = hasattr(router, "topk_group") and \
        router.topk_group * (num_experts // router.num_group) == layer.top_k
    if not groups_full:  # else the masked router fills up from -inf choices, the removed expert among them at weight 0
        assert not (got[2] == experts.unsqueeze(-1)).any()


def _implied_routing(layer, logits, selected, weights, effect, token: int, expert: int):
    """The routing of ``token`` without ``expert`` that a :class:`RemovalEffect` states, by its precedence: a re-run
    slot (the effect's own selection, else select_without), an alias of one, a swap of a selected expert, growth."""
    aliases = effect.rerun_alias[token].tolist() if effect.rerun_alias is not None else [-1] * effect.rerun.shape[1]
    for slot, (rerun, alias) in enumerate(zip(effect.rerun[token].tolist(), aliases)):
        if expert in (rerun, alias) and rerun >= 0:
            if effect.rerun_selected is not None:
                return effect.rerun_selected[token, slot], effect.rerun_weights[token, slot]
            _, w, s = layer.family.select_without(layer, logits, torch.tensor([token]), torch.tensor([rerun]))
            return s[0], w[0]
    row = selected[token].tolist()
    if effect.swap_factor is not None and expert in row:
        r = row.index(expert)
        keep = [c for c in range(len(row)) if c != r]
        ids = torch.tensor([row[c] for c in keep] + [int(effect.swap_expert[token])])
        w = torch.cat([weights[token, keep] * (1 + effect.swap_factor[token, r]), effect.swap_weight[token, r:r + 1]])
        return ids, w
    growth = 0.0 if effect.growth is None else effect.growth[token, expert]
    return selected[token], weights[token] * (1 + growth)


@pytest.mark.parametrize("overrides", [dict(n_routed_experts=64, n_group=8, topk_group=3, num_experts_per_tok=6),
                                       dict(n_routed_experts=256, n_group=8, topk_group=4, num_experts_per_tok=8),
                                       dict(n_routed_experts=16, n_group=8, topk_group=4, num_experts_per_tok=3)],
                         ids=["64-8-3", "256-8-4", "16-8-4"])
def test_deepseek_removal_effect_states_the_masked_selection(tiny, overrides) -> None:
    """For every (token, expert), the routing the DeepSeek-V3 family's RemovalEffect states (its closed-form group
    replacement with aliases, its re-runs, swaps) equals the router's selection with that expert masked. Logits are
    drawn so that groups often drop out (and some saturate, sigmoid = 1: ties the router breaks by itself, where
    only the weights are compared)."""
    model = tiny("deepseek_v3", seed=3, **overrides)
    layer = lp.find_moe_layers(model)[0]
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(48, layer.num_experts, generator=gen) * 3
    logits[40:, ::3] = 40.0                                   # saturated rows: many equal scores
    _, weights, selected = layer.family.select(layer, logits)
    effect = layer.family.removal_effect(layer, logits, selected)
    assert effect.rerun_alias is not None and (effect.rerun_alias >= 0).any(), "no group replaced in closed form"
    for token in range(logits.shape[0]):
        for expert in range(layer.num_experts):
            mask = torch.zeros(1, layer.num_experts, dtype=torch.bool)
            mask[0, expert] = True
            _, w_exp, s_exp = layer.family.select(layer, logits[token:token + 1], mask)
            s_got, w_got = _implied_routing(layer, logits, selected, weights, effect, token, expert)
            where = f"token {token}, expert {expert}"
            torch.testing.assert_close(w_got.sort().values, w_exp[0].sort().values, rtol=1e-6, atol=1e-7,
                                       msg=lambda m: f"{where}: {m}")
            if token < 40:
                assert sorted(s_got.tolist()) == sorted(s_exp[0].tolist()), where


def test_deepseek_removal_without_an_unselected_expert_in_the_chosen_groups(tiny) -> None:
    """Every expert of the chosen groups is selected (k = topk_group x group size): removing one leaves the router
    nothing in its groups, so the family re-runs those removals instead of a swap; Delta-H stays exact."""
    model = tiny("deepseek_v3", seed=3, n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=8)
    layer = lp.find_moe_layers(model)[0]
    router_input, _ = _router_and_expert_inputs(model, layer, _batches()[:1])[0]
    logits = layer.family.router_logits(layer, router_input.reshape(-1, router_input.shape[-1]))
    _, _, selected = layer.family.select(layer, logits)
    effect = layer.family.removal_effect(layer, logits, selected)
    rerun = [set(row.tolist()) - {-1} for row in effect.rerun]
    assert all(set(sel.tolist()) <= row for sel, row in zip(selected, rerun))

"""Masking and structural pruning: the masked model computes what the pruned model computes.

Per family and for a uniform plan, a non-uniform plan and a plan that leaves a layer at its
floor, the masked model's logits must equal those of a structurally pruned copy, and both must
differ from the unpruned model. Independently of prune_experts, the masked model must also equal
a freshly built smaller model whose weights are copied from the kept rows by hand.
"""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures import (
    BLOCK_ATTR,
    BLOCK_BIAS,
    IDENTITY_EXPERTS,
    ROW_BLOCK_EXPERTS,
    config_count,
    family_count_key,
    logits_of,
    padded_batch,
    random_keep,
    scores_for_layers,
    text_config_of,
)

import lightprune as lp
from lightprune.experts.mask import is_masked
from lightprune.experts.prune import resize_experts
from lightprune.testing.tiny import TINY_FAMILIES, tiny_model

PER_LAYER_KEY = "lightprune_experts_per_layer"
MASK_ATTR = "_lightprune_expert_mask"


def make_plan(layers, kind: str, seed: int) -> lp.ExpertPlan:
    """Random kept ids per layer: "uniform" (6 of 8 / 3 per group), "global" (counts differ by layer),
    "floor" (the first layer keeps exactly its floor, the others 5 / 3 per group)."""
    gen = torch.Generator().manual_seed(seed)
    keep = {}
    for i, layer in enumerate(layers):
        if kind == "uniform":
            count = 6
        elif kind == "global":
            count = (4, 6, 7)[i % 3] if layer.n_group == 1 else (6, 4)[i % 2]
        else:
            count = layer.min_experts if i == 0 else 6 if layer.n_group > 1 else 5
        assert count % layer.n_group == 0
        keep[layer.index] = random_keep(layer.num_experts, count, gen, n_group=layer.n_group)
    return lp.ExpertPlan(keep=keep, num_experts={layer.index: layer.num_experts for layer in layers})


def router_state(model):
    return [dict(vars(layer.router)) for layer in lp.find_moe_layers(model)]


@pytest.mark.parametrize("kind", ["uniform", "global", "floor"])
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_masking_equals_pruning(tiny, family, kind):
    model = tiny(family, seed=2)
    layers = lp.find_moe_layers(model)
    plan = make_plan(layers, kind, seed=TINY_FAMILIES.index(family))
    if kind == "floor":
        first = layers[0]
        assert len(plan.keep[first.index]) == first.min_experts == (2 * first.n_group if first.n_group > 1
                                                                    else first.top_k)
    batch = padded_batch(seed=1)
    original = copy.deepcopy(model)
    before_routers = router_state(model)

    base = logits_of(model, batch)
    with lp.mask_experts(model, plan) as masked_model:
        assert masked_model is model and is_masked(model)
        masked = logits_of(model, batch)
    after = logits_of(model, batch)

    assert torch.equal(after, base)
    assert router_state(model) == before_routers
    assert not is_masked(model)
    assert not any(hasattr(layer.router, MASK_ATTR) or "forward" in vars(layer.router)
                   for layer in lp.find_moe_layers(model))
    assert (masked - base).abs().max() > 1e-3  # the plan changes the model

    pruned_model = lp.prune_experts(copy.deepcopy(model), plan)
    pruned = logits_of(pruned_model, batch)
    torch.testing.assert_close(masked, pruned, atol=1e-5, rtol=1e-5)
    _check_pruned_structure(family, original, pruned_model, plan)


def _check_pruned_structure(family, original, pruned, plan):
    by_index = {layer.index: layer for layer in lp.find_moe_layers(original)}
    new_layers = lp.find_moe_layers(pruned)
    assert [layer.index for layer in new_layers] == sorted(by_index)
    for layer in new_layers:
        old = by_index[layer.index]
        keep = plan.keep[layer.index]
        idx = torch.tensor(keep)
        assert layer.num_experts == len(keep)
        rows = idx
        if family in IDENTITY_EXPERTS:  # LongCat-Flash: every zero-computation expert's row stays, after the kept ones
            zero = text_config_of(original).zero_expert_num
            rows = torch.cat([idx, torch.arange(old.num_experts, old.num_experts + zero)])
            assert torch.equal(layer.router.e_score_correction_bias, old.router.e_score_correction_bias[rows])
            assert (layer.router.n_routed_experts, layer.block.num_routed_experts) == (len(keep) + zero, len(keep))
            assert text_config_of(pruned).zero_expert_num == zero
        assert torch.equal(layer.router_linear.weight, old.router_linear.weight[rows])
        if family in BLOCK_BIAS:  # a selection bias the block keeps: the kept experts' entries
            name = BLOCK_BIAS[family]
            assert torch.equal(getattr(layer.block, name), getattr(old.block, name)[idx])
        if hasattr(layer.router, "per_expert_scale"):  # Gemma 4: the kept experts' scales
            assert torch.equal(layer.router.per_expert_scale, old.router.per_expert_scale[idx])
        norm = getattr(layer.experts, "post_expert_norm", None)
        if norm is not None and norm.weight.dim() == 2:  # Ergo: the kept experts' output-norm scales
            assert torch.equal(norm.weight, old.experts.post_expert_norm.weight[idx])
        if family in ROW_BLOCK_EXPERTS:  # DBRX: each kept expert's I rows of w1, v1 and w2
            size = config_count(text_config_of(original), ROW_BLOCK_EXPERTS[family])
            for name in ("w1", "v1", "w2"):
                before = getattr(old.experts.mlp, name)
                want = before.view(old.num_experts, size, -1)[idx].reshape(-1, before.shape[-1])
                assert torch.equal(getattr(layer.experts.mlp, name), want)
            up = "mlp.w1"
        else:
            up = "gate_up_proj" if hasattr(layer.experts, "gate_up_proj") else "up_proj"  # ungated: Nemotron-H
            assert torch.equal(getattr(layer.experts, up), getattr(old.experts, up)[idx])
            assert torch.equal(layer.experts.down_proj, old.experts.down_proj[idx])
        if family == "deepseek_v3":
            assert torch.equal(layer.router.e_score_correction_bias, old.router.e_score_correction_bias[idx])
            assert "e_score_correction_bias" in dict(layer.router.named_buffers())
        statics = getattr(layer.router, "moe_statics", None)
        if statics is not None:  # ERNIE-4.5's selection bias [1, E]: the kept experts' columns
            assert torch.equal(statics.e_score_correction_bias, old.router.moe_statics.e_score_correction_bias[:, idx])
        for module, names in ((layer.router, ("bias",)), (layer.experts, ("gate_up_proj_bias", "down_proj_bias"))):
            for name in names:  # per-expert biases (gpt-oss) are the kept experts' rows
                if getattr(module, name, None) is not None:
                    assert torch.equal(getattr(module, name), getattr(old.router if module is layer.router
                                                                      else old.experts, name)[idx])
        assert layer.experts.num_experts == len(keep)
        if hasattr(layer.router, "num_experts"):  # Gemma 4's router keeps no count
            assert layer.router.num_experts == len(keep)
        assert layer.experts.get_parameter(up).requires_grad
    # everything else is untouched (shared experts, attention, embeddings, dense layers)
    old_state = original.state_dict()
    pruned_state = pruned.state_dict()
    assert set(old_state) == set(pruned_state)
    per_expert = ("gate.weight", "gate.e_score_correction_bias", "experts.gate_up_proj", "experts.down_proj",
                  "experts.up_proj", "router.weight", "router.bias", "experts.gate_up_proj_bias",
                  "experts.down_proj_bias", "gate.moe_statics.e_score_correction_bias", "router.proj.weight",
                  "router.per_expert_scale", "gate.wg.weight", "e_score_correction_bias", "expert_bias",
                  "router.gate.weight", "feed_forward.gate.weight", "gate.linear.weight",
                  "experts.post_expert_norm.weight", "router.classifier.weight", "router.layer.weight",
                  "experts.mlp.w1", "experts.mlp.v1", "experts.mlp.w2")
    for name, tensor in old_state.items():
        block = f".{BLOCK_ATTR.get(family, 'mlp')}." if BLOCK_ATTR.get(family, "mlp") else ".layers."
        if not (block in name and name.endswith(per_expert) and "shared" not in name):
            assert torch.equal(pruned_state[name], tensor), name

    counts = plan.kept_counts()
    cfg = text_config_of(pruned)
    key = family_count_key(family)
    if plan.is_uniform:
        assert config_count(cfg, key) == next(iter(counts.values()))
        assert not hasattr(pruned.config, PER_LAYER_KEY)
        # copies of the count outside the MoE blocks (the causal LM's aux-loss size) follow the config
        if family in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe"):
            assert pruned.num_experts == config_count(cfg, key)
    else:
        assert config_count(cfg, key) == max(counts.values())
        assert getattr(pruned.config, PER_LAYER_KEY) == {str(k): v for k, v in counts.items()}


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3", "qwen2_moe"])
def test_masking_equals_a_hand_built_smaller_model(tiny, family):
    """Reference independent of prune_experts: a fresh model of the smaller size, weights copied by hand."""
    model = tiny(family, seed=6)
    layers = lp.find_moe_layers(model)
    kept = 6
    gen = torch.Generator().manual_seed(9)
    keep = {layer.index: random_keep(layer.num_experts, kept, gen, n_group=layer.n_group) for layer in layers}
    plan = lp.ExpertPlan(keep=keep, num_experts={layer.index: layer.num_experts for layer in layers})

    small = tiny_model(family, seed=0, **{family_count_key(family): kept})
    state = {}
    for name, tensor in model.state_dict().items():
        index = None
        if name.endswith(("mlp.gate.weight", "mlp.gate.e_score_correction_bias", "mlp.experts.gate_up_proj",
                          "mlp.experts.down_proj")):
            index = int(name.split(".layers.")[1].split(".")[0])
        state[name] = tensor[torch.tensor(keep[index])] if index is not None else tensor
    small.load_state_dict(state, strict=True)

    batch = padded_batch(seed=2)
    with lp.mask_experts(model, plan):
        masked = logits_of(model, batch)
    reference = logits_of(small, batch)
    torch.testing.assert_close(masked, reference, atol=1e-5, rtol=1e-5)
    assert (reference - logits_of(model, batch)).abs().max() > 1e-3


@pytest.mark.parametrize("overrides,floor,too_few", [
    # 16 experts in 4 groups, top-5 over 2 groups: each group keeps 3 (2 x 2 = 4 candidates < 5)
    (dict(n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=5), 12, 8),
    # one group, top-1: the group score is still a top-2 sum, so 2 experts stay
    (dict(n_group=1, topk_group=1, num_experts_per_tok=1), 2, 1),
], ids=["g4-top5", "g1-top1"])
def test_deepseek_floor_is_what_its_router_needs(tiny, overrides, floor, too_few):
    model = tiny("deepseek_v3", seed=1, **overrides)
    layers = lp.find_moe_layers(model)
    assert all(layer.min_experts == floor for layer in layers)
    gen = torch.Generator().manual_seed(3)
    num = {layer.index: layer.num_experts for layer in layers}
    n_group = layers[0].n_group
    too_small = lp.ExpertPlan(keep={layer.index: random_keep(layer.num_experts, too_few, gen, n_group=n_group)
                                    for layer in layers}, num_experts=num)
    with pytest.raises(lp.PlanError, match=f"floor of {floor}"):
        lp.prune_experts(copy.deepcopy(model), too_small)
    at_floor = lp.ExpertPlan(keep={layer.index: random_keep(layer.num_experts, floor, gen, n_group=n_group)
                                   for layer in layers}, num_experts=num)
    batch = padded_batch(seed=3)
    with lp.mask_experts(model, at_floor):
        masked = logits_of(model, batch)
    pruned = logits_of(lp.prune_experts(copy.deepcopy(model), at_floor), batch)
    torch.testing.assert_close(masked, pruned, atol=1e-5, rtol=1e-5)
    assert (masked - logits_of(model, batch)).abs().max() > 1e-3


def test_selected_plan_masks_and_prunes_alike(tiny):
    """select_experts on a model's own limits gives a plan the surgery accepts (deepseek groups included)."""
    for family in ("deepseek_v3", "qwen2_moe"):
        model = tiny(family, seed=8)
        layers = lp.find_moe_layers(model)
        scores = scores_for_layers(layers, seed=8)
        for allocation in ("uniform", "global"):
            plan = lp.select_experts(scores, 0.5, allocation=allocation)
            batch = padded_batch(seed=7)
            with lp.mask_experts(model, plan):
                masked = logits_of(model, batch)
            pruned = logits_of(lp.prune_experts(copy.deepcopy(model), plan), batch)
            torch.testing.assert_close(masked, pruned, atol=1e-5, rtol=1e-5)


def test_resize_then_load_rebuilds_a_non_uniform_prune(tiny):
    model = tiny("qwen3_moe", seed=9)
    plan = make_plan(lp.find_moe_layers(model), "global", seed=9)
    pruned = lp.prune_experts(copy.deepcopy(model), plan)
    shell = tiny("qwen3_moe", seed=1)
    resize_experts(shell, plan.kept_counts())
    assert {layer.index: layer.num_experts for layer in lp.find_moe_layers(shell)} == plan.kept_counts()
    shell.load_state_dict(pruned.state_dict(), strict=True)
    batch = padded_batch(seed=8)
    assert torch.equal(logits_of(shell, batch), logits_of(pruned, batch))
    with pytest.raises(ValueError, match=r"layers \[7\]"):
        resize_experts(shell, {7: 4})


# ----------------------------------------------------------------------------- restore and errors
def test_mask_restores_after_an_exception(tiny):
    model = tiny("mixtral", seed=1)
    layers = lp.find_moe_layers(model)
    plan = make_plan(layers, "uniform", seed=0)
    batch = padded_batch(seed=4)
    base = logits_of(model, batch)
    before = router_state(model)
    with pytest.raises(KeyError, match="boom"):
        with lp.mask_experts(model, plan):
            assert not torch.equal(logits_of(model, batch), base)
            raise KeyError("boom")
    assert router_state(model) == before
    assert torch.equal(logits_of(model, batch), base)


def test_nested_masking_is_refused_and_the_outer_mask_survives(tiny):
    model = tiny("olmoe", seed=1)
    plan = make_plan(lp.find_moe_layers(model), "uniform", seed=1)
    batch = padded_batch(seed=5)
    base = logits_of(model, batch)
    before = router_state(model)
    with lp.mask_experts(model, plan):
        masked = logits_of(model, batch)
        with pytest.raises(RuntimeError, match="already masked"):
            with lp.mask_experts(model, plan):
                pass
        assert is_masked(model)
        assert torch.equal(logits_of(model, batch), masked)
    assert router_state(model) == before
    assert torch.equal(logits_of(model, batch), base)


def test_mask_keeps_an_existing_instance_forward(tiny):
    model = tiny("qwen3_moe", seed=1)
    layer = lp.find_moe_layers(model)[0]
    calls = []
    original_forward = layer.router.forward

    def wrapped(hidden_states):
        calls.append(1)
        return original_forward(hidden_states)

    layer.router.forward = wrapped
    plan = make_plan(lp.find_moe_layers(model), "uniform", seed=2)
    with lp.mask_experts(model, plan):
        logits_of(model, padded_batch())
    assert not calls  # the mask replaced it inside the block
    assert layer.router.forward is wrapped
    logits_of(model, padded_batch())
    assert calls


def test_plans_that_do_not_fit_are_rejected_before_any_change(tiny):
    model = tiny("deepseek_v3", seed=1)
    layers = lp.find_moe_layers(model)
    num = {layer.index: layer.num_experts for layer in layers}
    full = {layer.index: list(range(layer.num_experts)) for layer in layers}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    cases = [
        (lp.ExpertPlan(keep={**full, 0: [0, 1, 4, 5]}, num_experts={**num, 0: 8}), r"layers \[0\]"),
        (lp.ExpertPlan(keep={1: list(range(6))}, num_experts={1: 6}), "made for 6 experts in layer 1"),
        (lp.ExpertPlan(keep={1: [0, 4]}, num_experts={1: 8}), "keeps 2 experts in layer 1, below its floor of 4"),
        (lp.ExpertPlan(keep={1: [0, 1, 2, 4, 5]}, num_experts={1: 8}), r"\[3, 2\] experts per group"),
    ]
    for plan, match in cases:
        with pytest.raises(lp.PlanError, match=match):
            with lp.mask_experts(model, plan):
                pass
        with pytest.raises(lp.PlanError, match=match):
            lp.prune_experts(model, plan)
        assert not is_masked(model)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert [layer.num_experts for layer in lp.find_moe_layers(model)] == [8, 8]


def test_floor_for_an_ungrouped_router_is_top_k(tiny):
    model = tiny("qwen3_moe", seed=1, num_experts_per_tok=3)
    plan = lp.ExpertPlan(keep={0: [1, 5]}, num_experts={0: 8})
    with pytest.raises(lp.PlanError, match="keeps 2 experts in layer 0, below its floor of 3"):
        lp.prune_experts(model, plan)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "qwen3_vl_moe"])
def test_pruned_model_trains_with_router_aux_loss(tiny, family):
    """The load-balancing loss of the pruned model is sized by its own expert count.

    A masked expert has probability 0 and no tokens, so per-expert terms agree and only the
    ``num_experts`` factor of the loss differs: aux(pruned) / 6 == aux(masked) / 8. transformers pools
    the per-expert terms over layers by expert position, so every layer keeps the same ids here.
    """
    model = tiny(family, seed=3)
    layers = lp.find_moe_layers(model)
    keep = [0, 2, 3, 4, 6, 7]
    plan = lp.ExpertPlan(keep={layer.index: keep for layer in layers}, num_experts={layer.index: 8 for layer in layers})
    batch = padded_batch(seed=6)
    kwargs = dict(batch, labels=batch["input_ids"], output_router_logits=True)
    with lp.mask_experts(model, plan):
        masked = model(**kwargs)
    pruned_model = lp.prune_experts(copy.deepcopy(model), plan)
    out = pruned_model(**kwargs)
    torch.testing.assert_close(out.aux_loss / 6, masked.aux_loss / 8, atol=1e-6, rtol=1e-5)
    out.loss.backward()
    for layer in lp.find_moe_layers(pruned_model):
        assert layer.experts.gate_up_proj.grad.shape[0] == 6


def test_prune_twice_and_back_to_uniform(tiny):
    model = tiny("qwen3_moe", seed=5)
    layers = lp.find_moe_layers(model)
    first = make_plan(layers, "global", seed=5)
    lp.prune_experts(model, first)
    assert hasattr(model.config, PER_LAYER_KEY)
    layers = lp.find_moe_layers(model)
    second = lp.ExpertPlan(keep={layer.index: list(range(4)) for layer in layers},
                           num_experts={layer.index: layer.num_experts for layer in layers})
    lp.prune_experts(model, second)
    assert model.config.num_experts == 4 and not hasattr(model.config, PER_LAYER_KEY)
    assert [layer.num_experts for layer in lp.find_moe_layers(model)] == [4, 4, 4]

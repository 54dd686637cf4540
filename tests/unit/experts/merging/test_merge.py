"""Merging applied to models: the frequency-weighted average by hand, M-SMoE's alignment, the reversible form
against the structural one, and merged == reloaded for every supported family."""

from __future__ import annotations

import json

import pytest
import torch
from fixtures import padded_batch

import lightprune as lp
from lightprune.experts.merging.align import has_standard_layout
from lightprune.export.verify import default_probe, model_logits
from lightprune.testing.tiny import TINY_FAMILIES

ATOL = 1e-5
PER_LAYER_KEY = "lightprune_experts_per_layer"


def cluster_plan(layer_clusters, dominants, coefficients, num_experts, **kw) -> lp.MergePlan:
    return lp.MergePlan(clusters=layer_clusters, dominant=dominants, coefficients=coefficients,
                        num_experts=num_experts, **kw)


def mixtral_plan(model, router="dominant", align=False) -> lp.MergePlan:
    """Layer 0: {0, 2, 5} into 2 (0.5 / 0.3 / 0.2), the rest alone; layer 1 untouched (singletons)."""
    layers = lp.find_moe_layers(model)
    clusters = {0: [[0, 2, 5], [1], [3], [4], [6], [7]], 1: [[e] for e in range(layers[1].num_experts)]}
    dominant = {0: [2, 1, 3, 4, 6, 7], 1: list(range(layers[1].num_experts))}
    coefficients = {0: [[0.5, 0.3, 0.2]] + [[1.0]] * 5, 1: [[1.0]] * layers[1].num_experts}
    return cluster_plan(clusters, dominant, coefficients, {l.index: l.num_experts for l in layers}, router=router,
                        align=align)


@pytest.mark.parametrize("router", ["dominant", "average"])
def test_frequency_weighted_merge_equals_the_hand_computation(tiny, router) -> None:
    model = tiny("mixtral", seed=1)
    layer = lp.find_moe_layers(model)[0]
    gate_up, down = layer.experts.gate_up_proj.detach().clone(), layer.experts.down_proj.detach().clone()
    rows = layer.router_linear.weight.detach().clone()
    lp.merge_experts(model, mixtral_plan(model, router))
    merged = lp.find_moe_layers(model)[0]
    assert merged.num_experts == 6  # kept: 1, 2, 3, 4, 6, 7; the merged expert sits where 2 was: index 1
    torch.testing.assert_close(merged.experts.gate_up_proj[1], 0.5 * gate_up[0] + 0.3 * gate_up[2] + 0.2 * gate_up[5])
    torch.testing.assert_close(merged.experts.down_proj[1], 0.5 * down[0] + 0.3 * down[2] + 0.2 * down[5])
    torch.testing.assert_close(merged.experts.gate_up_proj[0], gate_up[1], rtol=0, atol=0)
    expected_row = rows[2] if router == "dominant" else 0.5 * rows[0] + 0.3 * rows[2] + 0.2 * rows[5]
    torch.testing.assert_close(merged.router_linear.weight[1], expected_row)
    torch.testing.assert_close(merged.router_linear.weight[[0, 2, 3, 4, 5]], rows[[1, 3, 4, 6, 7]], rtol=0, atol=0)


def test_alignment_merges_a_permuted_copy_back_into_the_original(tiny) -> None:
    """Expert 1 is expert 0 with its neurons shuffled: aligned, their average is expert 0 again; unaligned, not."""
    model = tiny("mixtral", seed=3)
    layers = lp.find_moe_layers(model)
    experts = layers[0].experts
    inter = experts.down_proj.shape[-1]
    perm = torch.randperm(inter, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        gate, up = experts.gate_up_proj[0][:inter], experts.gate_up_proj[0][inter:]
        experts.gate_up_proj[1] = torch.cat([gate[perm], up[perm]])
        experts.down_proj[1] = experts.down_proj[0][:, perm]
    original = experts.gate_up_proj[0].detach().clone(), experts.down_proj[0].detach().clone()
    clusters = {0: [[0, 1]] + [[e] for e in range(2, 8)], 1: [[e] for e in range(8)]}
    dominant = {0: [0, 2, 3, 4, 5, 6, 7], 1: list(range(8))}
    coefficients = {0: [[0.5, 0.5]] + [[1.0]] * 6, 1: [[1.0]] * 8}
    for align in (True, False):
        candidate = tiny("mixtral", seed=3)
        candidate.load_state_dict(model.state_dict())
        lp.merge_experts(candidate, cluster_plan(clusters, dominant, coefficients, {0: 8, 1: 8}, align=align))
        merged = lp.find_moe_layers(candidate)[0].experts
        same = torch.allclose(merged.gate_up_proj[0], original[0], atol=1e-6) and \
            torch.allclose(merged.down_proj[0], original[1], atol=1e-6)
        assert same is align


def test_reversible_merge_computes_the_structural_merge_and_restores_the_model(tiny) -> None:
    model = tiny("qwen3_moe", seed=4)
    batch = padded_batch(model.config.vocab_size)
    before = model_logits(model, batch)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    stats = lp.collect_expert_stats(model, [batch], criteria=["frequency", "expert_outputs"], progress=False)
    plan = lp.hc_smoe_plan(stats, 0.5, router="average")
    with lp.merged_experts(model, plan):
        inside = model_logits(model, batch)
        with pytest.raises(ValueError, match="inside mask_experts"):
            lp.merge_experts(model, plan)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    torch.testing.assert_close(model_logits(model, batch), before, rtol=0, atol=0)
    assert (inside - before).abs().max() > 1e-3
    lp.merge_experts(model, plan)
    torch.testing.assert_close(model_logits(model, batch), inside, rtol=0, atol=ATOL)


def random_merge_plan(model, seed: int, router: str, align: bool) -> lp.MergePlan:
    """Half of every layer's experts dominant (every group keeps the same count); each other expert joins a random
    dominant of its group; coefficients drawn at random (normalised)."""
    gen = torch.Generator().manual_seed(seed)
    clusters, dominant, coefficients, counts = {}, {}, {}, {}
    for layer in lp.find_moe_layers(model):
        E, groups = layer.num_experts, max(layer.n_group, 1)
        size = E // groups
        members: dict[int, list[int]] = {}
        for g in range(groups):
            ids = (torch.randperm(size, generator=gen) + g * size).tolist()
            doms, rest = ids[:size // 2], ids[size // 2:]
            members.update({d: [d] for d in doms})
            for e in rest:
                members[doms[int(torch.randint(len(doms), (1,), generator=gen))]].append(e)
        order = sorted(members)
        clusters[layer.index] = [members[d] for d in order]
        dominant[layer.index] = order
        weights = [torch.rand(len(members[d]), generator=gen, dtype=torch.float64) + 0.1 for d in order]
        coefficients[layer.index] = [(w / w.sum()).tolist() for w in weights]
        for ws in coefficients[layer.index]:
            ws[-1] = 1.0 - sum(ws[:-1])
        counts[layer.index] = E
    return cluster_plan(clusters, dominant, coefficients, counts, router=router, align=align, method="random")


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_merged_model_equals_its_reloaded_checkpoint(tmp_path, tiny, family) -> None:
    model = tiny(family, seed=5).float().eval()
    experts = lp.find_moe_layers(model)[0].experts
    index = TINY_FAMILIES.index(family)
    plan = random_merge_plan(model, index, router=("dominant", "average")[index % 2],
                             align=has_standard_layout(experts))
    probe = default_probe(model)
    original = model_logits(model, probe)
    with lp.merged_experts(model, plan):
        reference = model_logits(model, probe)
    assert (reference - original).abs().max() > 1e-4  # the merge changes the model
    report = lp.export_pruned(model, plan, tmp_path / "merged")
    assert report.uniform and report.max_abs_diff <= ATOL
    config = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert PER_LAYER_KEY not in config and "auto_map" not in config  # plain from_pretrained loads it
    manifest = json.loads((tmp_path / "merged" / "lightprune_export.json").read_text())
    assert manifest["plan"]["metadata"]["merge"] == plan.to_dict()
    reloaded = lp.load_pruned(tmp_path / "merged")
    torch.testing.assert_close(model_logits(reloaded, probe), reference, rtol=0, atol=ATOL)
    # the in-memory merged model and its reloaded checkpoint: the same tensors, the same logits exactly
    torch.testing.assert_close(model_logits(model, probe), model_logits(reloaded, probe), rtol=0, atol=0)


def test_a_non_uniform_merge_exports_with_the_per_layer_counts(tmp_path, tiny) -> None:
    """M-SMoE with dominants ranked across layers keeps different counts per layer: the checkpoint records them
    and lp.load_pruned rebuilds that layout, computing the merged model."""
    model = tiny("qwen3_moe", seed=3).eval()  # on this seed the layers keep 3, 6 and 3 merged experts
    batches = [padded_batch(model.config.vocab_size, seed=s) for s in range(3)]
    stats = lp.collect_expert_stats(model, batches, criteria=["router_logits"], progress=False)
    plan = lp.m_smoe_plan(stats, 0.5, allocation="global")
    assert not plan.is_uniform and plan.total_merged_away == 12
    probe = default_probe(model)
    with lp.merged_experts(model, plan):
        reference = model_logits(model, probe)
    lp.export_pruned(model, plan, tmp_path / "merged")
    config = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert {int(k): v for k, v in config[PER_LAYER_KEY].items()} == plan.kept_counts()
    torch.testing.assert_close(model_logits(lp.load_pruned(tmp_path / "merged"), probe), reference, rtol=0,
                               atol=ATOL)

"""Ground-truth KL per removed expert (MAEP App. I) against one masked forward per expert."""

from __future__ import annotations

import math

import pytest
import torch
from fixtures import REPO

import lightprune as lp
from lightprune.experts.calibration.validation import ground_truth_kl, proxy_correlations, ranking_stability
from lightprune.testing.tiny import tiny_model


def _batches(seed: int, n: int = 2):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(3, 100, (2, 9), generator=g)
        mask = torch.ones_like(ids)
        mask[1, :3] = 0
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def _brute_force(model, batches, layer_index: int, expert: int) -> float:
    """One forward per expert, the layer's router masking it (mask_experts would refuse a DeepSeek
    plan with unequal groups, which a one-expert removal is: the counterfactual needs no pruning)."""
    layer = next(l for l in lp.find_moe_layers(model) if l.index == layer_index)
    mask = torch.zeros(layer.num_experts, dtype=torch.bool)
    mask[expert] = True
    per_sample = []
    with torch.no_grad():
        for batch in batches:
            full = torch.log_softmax(model(**batch).logits.double(), -1)
            layer.router.forward = lambda h: layer.route(h, mask)
            try:
                removed = torch.log_softmax(model(**batch).logits.double(), -1)
            finally:
                del layer.router.forward
            kl = (full.exp() * (full - removed)).sum(-1)
            for row, valid in zip(kl, batch["attention_mask"].bool()):
                per_sample.append(float(row[valid].mean()))
    return sum(per_sample) / len(per_sample)


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_ground_truth_equals_one_masked_forward_per_expert(family: str) -> None:
    model = tiny_model(family)
    batches = _batches(0)
    truth = ground_truth_kl(model, batches, expert_chunk=3, progress=False).raw("kl", "all")
    for layer in lp.find_moe_layers(model):
        for expert in (0, layer.num_experts - 1):
            expected = _brute_force(model, batches, layer.index, expert)
            assert math.isclose(float(truth[layer.index][expert]), expected, rel_tol=1e-6, abs_tol=1e-12)
    assert all(bool((v > 0).any()) for v in truth.values())


def test_correlations_and_stability_are_spearman_of_the_right_vectors() -> None:
    from scipy.stats import spearmanr

    model = tiny_model("qwen3_moe")
    a, b = _batches(1), _batches(2)
    stats_a = lp.collect_expert_stats(model, a, progress=False)
    stats_b = lp.collect_expert_stats(model, b, progress=False)
    truth = ground_truth_kl(model, a, progress=False)
    rhos = proxy_correlations(stats_a, truth)
    stability = ranking_stability(stats_a, stats_b, "delta_h", ["all"])
    for layer in lp.find_moe_layers(model):
        key = str(layer.index)
        expected = spearmanr(stats_a.raw("delta_h")[layer.index], truth.raw("kl")[layer.index]).statistic
        assert math.isclose(rhos["all"]["delta_h"]["per_layer"][key], expected, abs_tol=1e-12)
        expected = spearmanr(stats_a.raw("delta_h")[layer.index], stats_b.raw("delta_h")[layer.index]).statistic
        assert math.isclose(stability["all"]["per_layer"][key], expected, abs_tol=1e-12)


def test_validation_command_writes_its_report(tmp_path) -> None:
    import importlib.util
    import json

    script = REPO / "scripts" / "validate_proxies.py"
    spec = importlib.util.spec_from_file_location("validate_proxies", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report = module.main(["--tiny", "qwen3_moe", "--samples", "4", "--batch-size", "2", "--out", str(tmp_path)])
    assert (tmp_path / "proxy_rho.png").stat().st_size > 0
    assert json.loads((tmp_path / "validation.json").read_text())["proxy_rho"] == report["proxy_rho"]
    assert set(report["proxy_rho"]["all"]) == {"delta_h", "reap", "routing_kl"}
    assert set(report["ranking_stability"]) == {"delta_h", "reap"}

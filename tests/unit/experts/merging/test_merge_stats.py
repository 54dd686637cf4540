"""The merging statistics of the calibration pass against brute force, and the HC-SMoE / M-SMoE plans built from
them against independent computations (scipy's average linkage, hand-made statistics)."""

from __future__ import annotations

import pytest
import torch
from fixtures import padded_batch

import lightprune as lp
from lightprune.experts.calibration import CalibrationStats
from lightprune.models.layer import RoutingLimits
from lightprune.observe.experts_impl import run_expert


def captured_inputs(model, batch):
    """{layer: (experts' input [T, H], router input [T, H'])} of one plain forward."""
    seen = {}
    handles = []
    for layer in lp.find_moe_layers(model):
        def keep(key, which):
            def hook(module, args, kwargs):
                hidden = args[0] if args else kwargs["hidden_states"]
                seen.setdefault(key, {})[which] = hidden.reshape(-1, hidden.shape[-1]).detach().clone()
            return hook
        handles.append(layer.experts.register_forward_pre_hook(keep(layer.index, "experts"), with_kwargs=True))
        handles.append(layer.router.register_forward_pre_hook(keep(layer.index, "router"), with_kwargs=True))
    with torch.no_grad():
        model(**batch)
    for h in handles:
        h.remove()
    return seen


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "deepseek_v3", "nemotron_h"])
def test_statistics_equal_brute_force_over_unpadded_tokens(tiny, family) -> None:
    model = tiny(family, seed=6).float().eval()
    batches = [padded_batch(model.config.vocab_size, seed=s, pad=3) for s in (0, 1)]
    stats = lp.collect_expert_stats(model, batches, criteria=["expert_outputs", "router_logits"], progress=False)
    assert stats.has("frequency")  # the merges' weights come with any merging statistic
    sums, grams, tokens = {}, {}, 0
    for batch in batches:
        keep = batch["attention_mask"].reshape(-1).bool()
        tokens += int(keep.sum())
        for index, seen in captured_inputs(model, batch).items():
            layer = next(l for l in lp.find_moe_layers(model) if l.index == index)
            h = seen["experts"][keep]
            with torch.no_grad():
                out = torch.stack([run_expert(layer.experts, e, h).sum(dim=0) for e in range(layer.num_experts)])
                weight = layer.router_linear.weight.float()
                logits = seen["router"][keep].float() @ weight.T
                if getattr(layer.router_linear, "bias", None) is not None:
                    logits = logits + layer.router_linear.bias
            sums[index] = sums.get(index, 0) + out.double()
            grams[index] = grams.get(index, 0) + (logits.T @ logits).double()
    outputs, gram = stats.merging_statistic("expert_outputs"), stats.merging_statistic("router_logits")
    assert set(outputs) == set(sums)
    for index in sums:
        torch.testing.assert_close(outputs[index], sums[index] / tokens, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(gram[index], grams[index] / tokens, rtol=1e-5, atol=1e-5)


def test_missing_statistic_says_how_to_collect_it(tiny) -> None:
    model = tiny("mixtral")
    stats = lp.collect_expert_stats(model, [padded_batch(model.config.vocab_size)], progress=False)
    with pytest.raises(KeyError, match="collect it with criteria including 'expert_outputs'"):
        lp.hc_smoe_plan(stats, 0.5)
    with pytest.raises(ValueError, match="unknown calibration criteria \\['outputs'\\]"):
        lp.collect_expert_stats(model, [padded_batch(model.config.vocab_size)], criteria=["outputs"], progress=False)


def test_hc_smoe_clusters_are_scipys_average_linkage_on_the_same_distances(tiny) -> None:
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import pdist

    model = tiny("qwen3_moe", seed=7)
    batches = [padded_batch(model.config.vocab_size, seed=s) for s in range(3)]
    stats = lp.collect_expert_stats(model, batches, criteria=["frequency", "expert_outputs"], progress=False)
    for ratio in (0.25, 0.5):
        plan = lp.hc_smoe_plan(stats, ratio)
        freq = stats.raw("frequency")
        for index, outputs in stats.merging_statistic("expert_outputs").items():
            kept = len(plan.clusters[index])
            assert kept == outputs.shape[0] - int(ratio * outputs.shape[0])
            labels = fcluster(linkage(pdist(outputs.numpy()), method="average"), t=kept, criterion="maxclust")
            expected = {frozenset(int(e) for e in (labels == c).nonzero()[0]) for c in set(labels)}
            assert {frozenset(c) for c in plan.clusters[index]} == expected
            for members, dom, coef in zip(plan.clusters[index], plan.dominant[index], plan.coefficients[index]):
                f = freq[index][members]
                assert dom == members[int(torch.argmax(f))]
                if f.sum() > 0:
                    torch.testing.assert_close(torch.tensor(coef, dtype=torch.float64), f / f.sum())


def hand_stats(frequency, gram=None, outputs=None, top_k=2) -> CalibrationStats:
    E = len(frequency)
    merging = {}
    if gram is not None:
        merging["router_logits"] = {0: torch.tensor(gram, dtype=torch.float64)}
    if outputs is not None:
        merging["expert_outputs"] = {0: torch.tensor(outputs, dtype=torch.float64)}
    return CalibrationStats({("frequency", "all"): {0: torch.tensor(frequency, dtype=torch.float64)}},
                            {0: RoutingLimits(num_experts=E, top_k=top_k)}, merging=merging)


def test_m_smoe_groups_each_expert_with_its_most_similar_dominant() -> None:
    # logit columns of 6 experts over 3 tokens: 0 ~ 3, 1 ~ 4 ~ 5 (and 5 slightly closer to 2 than 4 is)
    columns = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0],
                            [0.9, 0.1, 0.0], [0.1, 0.9, 0.0], [0.0, 0.6, 0.5]], dtype=torch.float64)
    gram = (columns @ columns.T).tolist()
    stats = hand_stats([10, 9, 8, 1, 2, 3], gram=gram)
    plan = lp.m_smoe_plan(stats, 0.5)  # keeps 3: the most frequent 0, 1, 2 dominate
    cos = torch.nn.functional.normalize(columns, dim=1) @ torch.nn.functional.normalize(columns, dim=1).T
    expected = {0: [0], 1: [1], 2: [2]}
    for e in (3, 4, 5):
        expected[max((0, 1, 2), key=lambda d: float(cos[e, d]))].append(e)
    assert plan.clusters[0] == sorted(sorted(v) for v in expected.values())
    assert plan.dominant[0] == [0, 1, 2] and plan.align is True
    for members, coef in zip(plan.clusters[0], plan.coefficients[0]):
        f = torch.tensor([[10, 9, 8, 1, 2, 3][e] for e in members], dtype=torch.float64)
        torch.testing.assert_close(torch.tensor(coef, dtype=torch.float64), f / f.sum())


def test_a_cluster_never_routed_gets_equal_coefficients() -> None:
    outputs = [[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.1, 5.0]]
    plan = lp.hc_smoe_plan(hand_stats([3, 1, 0, 0], outputs=outputs), 0.5)
    assert plan.clusters[0] == [[0, 1], [2, 3]]
    assert plan.coefficients[0] == [[0.75, 0.25], [0.5, 0.5]] and plan.dominant[0] == [0, 2]


def test_a_streamed_calibration_gives_the_same_merging_statistics(tiny, tmp_path) -> None:
    """collect_expert_stats on a checkpoint directory (one decoder layer resident at a time) sums the same."""
    model = tiny("qwen3_moe", seed=1).eval()
    model.save_pretrained(tmp_path / "ckpt")
    batches = [padded_batch(model.config.vocab_size, seed=s) for s in (0, 1)]
    criteria = ["frequency", "expert_outputs", "router_logits"]
    memory = lp.collect_expert_stats(model, batches, criteria=criteria, progress=False)
    streamed = lp.collect_expert_stats(tmp_path / "ckpt", batches, criteria=criteria, progress=False)
    for name in ("expert_outputs", "router_logits"):
        a, b = memory.merging_statistic(name), streamed.merging_statistic(name)
        assert set(a) == set(b) and all(torch.equal(a[l], b[l]) for l in a)


def test_the_merging_sums_resume_from_a_saved_state(tiny) -> None:
    """An observer's state after one batch, loaded into a fresh observer that sees the second batch, gives the
    statistics of one pass over both; a state saved without the merging statistics is refused."""
    from lightprune.experts.calibration import ExpertObserver

    model = tiny("mixtral", seed=2).eval()
    batches = [padded_batch(model.config.vocab_size, seed=s) for s in (0, 1)]
    criteria = ["frequency", "expert_outputs", "router_logits"]
    whole = lp.collect_expert_stats(model, batches, criteria=criteria, progress=False)

    def observe(observer, batch):
        with observer, torch.no_grad():
            observer.begin_batch(batch)
            model(**batch)

    first = ExpertObserver(model, criteria=criteria)
    observe(first, batches[0])
    second = ExpertObserver(model, criteria=criteria)
    second.load_state_dict(first.state_dict())
    observe(second, batches[1])
    resumed = second.result()
    for name in ("expert_outputs", "router_logits"):
        a, b = whole.merging_statistic(name), resumed.merging_statistic(name)
        assert all(torch.allclose(a[l], b[l], rtol=1e-12, atol=1e-12) for l in a)
    plain = ExpertObserver(model, criteria=["frequency"])
    observe(plain, batches[0])
    with pytest.raises(ValueError, match="no merging statistics \\['expert_outputs', 'router_logits'\\]"):
        ExpertObserver(model, criteria=criteria).load_state_dict(plain.state_dict())

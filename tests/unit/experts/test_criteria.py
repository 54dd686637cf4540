"""Weight-only criteria and the criterion registry (lightprune.experts.criteria).

Expected values are computed independently: plain Python float64 loops over each expert's
slices of the fused tensors, never through lightprune's reduction helpers.
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

import lightprune as lp
from lightprune.experts.criteria import (
    AIMER,
    Criterion,
    CriterionNeedsDataError,
    available_criteria,
    get_criterion,
    register_criterion,
    score_weights,
    unregister_criterion,
)
from lightprune.experts.criteria.weights import expert_weight_norms
from lightprune.testing.tiny import TINY_FAMILIES, tiny_model

WEIGHT_CRITERIA = ("aimer", "magnitude", "router_norm", "random")


@pytest.fixture(scope="module")
def models():
    cache: dict[str, torch.nn.Module] = {}

    def get(family: str) -> torch.nn.Module:
        if family not in cache:
            cache[family] = tiny_model(family)
        return cache[family]

    return get


@pytest.fixture
def fresh_qwen3():
    return tiny_model("qwen3_moe", seed=5)


@pytest.fixture
def registry_guard():
    """Remove any criterion a test registers."""
    before = set(available_criteria())
    yield
    for name in set(available_criteria()) - before:
        unregister_criterion(name)


# ----------------------------------------------------------------------------- references
def _expert_values(layer, e: int) -> list[float]:
    """Expert e's gate, up and down weights flattened, as Python floats (float64)."""
    values: list[float] = []
    for name in ("gate_up_proj", "down_proj"):
        values.extend(getattr(layer.experts, name)[e].detach().double().flatten().tolist())
    return values


def _ref_aimer(values: list[float]) -> float:
    l1 = math.fsum(abs(v) for v in values)
    l2 = math.sqrt(math.fsum(v * v for v in values))
    return l1 / (math.sqrt(len(values)) * l2)


def _ref_frobenius(values: list[float]) -> float:
    return math.sqrt(math.fsum(v * v for v in values))


def _assert_close(actual: torch.Tensor, expected: list[float], rtol: float = 1e-7) -> None:
    assert actual.dtype == torch.float64
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float64), rtol=rtol, atol=0)


# ----------------------------------------------------------------------------- AIMER
def test_aimer_bounds_on_hand_built_experts(fresh_qwen3):
    layer = lp.find_moe_layers(fresh_qwen3)[0]
    gate_up, down = layer.experts.gate_up_proj, layer.experts.down_proj
    n = gate_up[0].numel() + down[0].numel()
    with torch.no_grad():
        gate_up[0].fill_(0.5)                 # all equal: AIMER = 1 (exact in binary)
        down[0].fill_(0.5)
        gate_up[1].zero_()                    # one-hot: AIMER = 1/sqrt(N)
        down[1].zero_()
        down[1][3, 2] = -2.0
        gate_up[2].fill_(-0.25)               # equal magnitudes, mixed signs: AIMER = 1
        down[2].fill_(0.25)
        gate_up[3].zero_()                    # all zero: defined as 1 (pruned first)
        down[3].zero_()
        gate_up[4].zero_()                    # half the entries at +-c: AIMER = 1/sqrt(2)
        gate_up[4][:, : gate_up.shape[2] // 2] = 1.5
        down[4].zero_()
        down[4][:, : down.shape[2] // 2] = -1.5
        gate_up[5].fill_(0.3)                 # all equal, inexact in binary: still within the bound
        down[5].fill_(-0.3)
    raw = score_weights(fresh_qwen3, "aimer").raw[layer.index]
    assert raw[0].item() == 1.0
    assert raw[1].item() == pytest.approx(1.0 / math.sqrt(n), abs=1e-12)
    assert raw[2].item() == 1.0
    assert raw[3].item() == 1.0
    assert raw[4].item() == pytest.approx(1.0 / math.sqrt(2.0), abs=1e-12)
    assert raw[5].item() == pytest.approx(1.0, abs=1e-7) and raw[5].item() <= 1.0
    others = [_ref_aimer(_expert_values(layer, e)) for e in range(6, layer.num_experts)]
    _assert_close(raw[6:], others, rtol=1e-7)


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_aimer_matches_formula(models, family):
    model = models(family)
    scores = score_weights(model, "aimer")
    assert scores.criterion == "aimer"
    for layer in lp.find_moe_layers(model):
        expected = [_ref_aimer(_expert_values(layer, e)) for e in range(layer.num_experts)]
        _assert_close(scores.raw[layer.index], expected)
        _assert_close(scores[layer.index], [-x for x in expected])
        n = len(_expert_values(layer, 0))
        assert all(1 / math.sqrt(n) <= x <= 1 for x in expected)


def test_aimer_scale_invariant_and_block_independent(fresh_qwen3):
    before = score_weights(fresh_qwen3, "aimer").raw
    layer = lp.find_moe_layers(fresh_qwen3)[1]
    with torch.no_grad():
        layer.experts.gate_up_proj[2].mul_(7.5)
        layer.experts.down_proj[2].mul_(7.5)
    after = score_weights(fresh_qwen3, "aimer").raw
    blocked = score_weights(fresh_qwen3, "aimer", block_elements=100).raw
    tiny_blocks = score_weights(fresh_qwen3, "aimer", block_elements=7).raw  # smaller than a row
    for index in before:
        torch.testing.assert_close(after[index], before[index], rtol=1e-6, atol=0)
        torch.testing.assert_close(blocked[index], after[index], rtol=1e-9, atol=0)
        torch.testing.assert_close(tiny_blocks[index], after[index], rtol=1e-9, atol=0)


def test_weight_norms_serial_and_threaded_agree(models):
    layer = lp.find_moe_layers(models("mixtral"))[1]
    serial = expert_weight_norms(layer, workers=1, block_elements=64)
    for workers in (2, 3):
        threaded = expert_weight_norms(layer, workers=workers, block_elements=64)
        torch.testing.assert_close(threaded[0], serial[0], rtol=1e-12, atol=0)
        torch.testing.assert_close(threaded[1], serial[1], rtol=1e-12, atol=0)
        assert threaded[2] == serial[2]
    with pytest.raises(ValueError, match="workers"):
        expert_weight_norms(layer, workers=0)


def test_weight_norms_bf16_and_large_expert_accuracy():
    """bf16 weights are reduced in fp32 per chunk; fp32 partials accumulate in float64."""
    model = tiny_model("olmoe", seed=1, hidden_size=64, intermediate_size=512)
    model = model.to(torch.bfloat16)
    layer = lp.find_moe_layers(model)[0]
    l1, sq, numel = expert_weight_norms(layer, block_elements=1000)
    assert numel == 3 * 512 * 64
    for e in range(layer.num_experts):
        values = _expert_values(layer, e)
        assert l1[e].item() == pytest.approx(math.fsum(abs(v) for v in values), rel=1e-6)
        assert sq[e].item() == pytest.approx(math.fsum(v * v for v in values), rel=1e-6)


def test_non_contiguous_expert_tensors_read_in_place(fresh_qwen3):
    """A transposed storage (same values, strided view) scores the same, without copies."""
    expected = score_weights(fresh_qwen3, "aimer").raw
    magnitude = score_weights(fresh_qwen3, "magnitude").raw
    for layer in lp.find_moe_layers(fresh_qwen3):
        for name in ("gate_up_proj", "down_proj"):
            old = getattr(layer.experts, name)
            strided = old.detach().transpose(1, 2).contiguous().transpose(1, 2)
            assert not strided.is_contiguous() and torch.equal(strided, old)
            setattr(layer.experts, name, torch.nn.Parameter(strided))
    got = score_weights(fresh_qwen3, "aimer").raw
    got_magnitude = score_weights(fresh_qwen3, "magnitude").raw
    for index in expected:
        torch.testing.assert_close(got[index], expected[index], rtol=1e-9, atol=0)
        torch.testing.assert_close(got_magnitude[index], magnitude[index], rtol=1e-9, atol=0)


def test_ungated_experts_with_up_proj():
    """Experts with ``up_proj`` instead of ``gate_up_proj``; biases are not weights."""
    from lightprune.models import MoELayer

    gen = torch.Generator().manual_seed(3)
    experts = torch.nn.Module()
    experts.up_proj = torch.nn.Parameter(torch.randn(4, 6, 5, generator=gen))
    experts.down_proj = torch.nn.Parameter(torch.randn(4, 5, 6, generator=gen))
    experts.up_proj_bias = torch.nn.Parameter(torch.randn(4, 6, generator=gen))
    layer = MoELayer(index=0, name="fake", block=torch.nn.Module(), router=torch.nn.Linear(5, 4, bias=False),
                     experts=experts, num_experts=4, top_k=2, has_shared_experts=False)
    l1, sq, numel = expert_weight_norms(layer, block_elements=8)
    assert numel == 60
    for e in range(4):
        values = experts.up_proj[e].double().flatten().tolist() + experts.down_proj[e].double().flatten().tolist()
        assert l1[e].item() == pytest.approx(math.fsum(abs(v) for v in values), rel=1e-7)
        assert sq[e].item() == pytest.approx(math.fsum(v * v for v in values), rel=1e-7)
        assert AIMER().score_layer(layer)[e].item() == pytest.approx(_ref_aimer(values), rel=1e-7)


def test_expert_weights_missing_is_an_error(fresh_qwen3):
    layer = lp.find_moe_layers(fresh_qwen3)[0]
    layer.experts.down_proj = torch.nn.Parameter(torch.zeros(3, 4, 5))
    with pytest.raises(ValueError, match="one slice per routed expert"):
        score_weights(fresh_qwen3, "magnitude")


# ----------------------------------------------------------------------------- other criteria
def test_magnitude_matches_frobenius(models):
    model = models("mixtral")
    scores = score_weights(model, "magnitude")
    for layer in lp.find_moe_layers(model):
        expected = [_ref_frobenius(_expert_values(layer, e)) for e in range(layer.num_experts)]
        _assert_close(scores.raw[layer.index], expected)
        _assert_close(scores[layer.index], expected)


def test_router_norm_matches_rows(models):
    model = models("deepseek_v3")
    scores = score_weights(model, "router_norm")
    for layer in lp.find_moe_layers(model):
        rows = layer.router.weight.detach().double().tolist()
        expected = [math.sqrt(math.fsum(v * v for v in row)) for row in rows]
        _assert_close(scores[layer.index], expected)


def test_random_reproducible_and_seed_sensitive(models):
    model = models("qwen3_moe")
    a = score_weights(model, "random", seed=11)
    b = score_weights(model, "random", seed=11)
    c = score_weights(model, "random", seed=12)
    layers = sorted(a)
    assert len(layers) >= 2
    for index in layers:
        assert torch.equal(a[index], b[index])
        assert not torch.equal(a[index], c[index])
        assert ((a[index] >= 0) & (a[index] < 1)).all()
    assert not torch.equal(a[layers[0]], a[layers[1]])  # layers draw differently
    assert torch.equal(get_criterion("random", seed=11).score(model)[layers[0]], a[layers[0]])
    # the default seed is 0 and is reproducible too
    assert torch.equal(score_weights(model, "random")[layers[0]], score_weights(model, "random", seed=0)[layers[0]])


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_every_family_scores_every_routed_expert(models, family):
    model = models(family)
    layers = lp.find_moe_layers(model)
    for name in WEIGHT_CRITERIA:
        scores = score_weights(model, name)
        assert sorted(scores) == [layer.index for layer in layers]  # dense layers absent
        for layer in layers:
            assert scores[layer.index].shape == (layer.num_experts,)  # shared experts never scored
            assert torch.isfinite(scores[layer.index]).all()
            assert scores.limits[layer.index] == layer.limits
        assert scores.criterion == name
        scores.to_json()


def test_dense_and_shared_expert_layers_are_skipped(models):
    qwen2 = models("qwen2_moe")          # mlp_only_layers=[1], shared_expert
    assert sorted(score_weights(qwen2, "magnitude")) == [0, 2]
    deepseek = models("deepseek_v3")     # first_k_dense_replace=1, shared_experts
    assert sorted(score_weights(deepseek, "aimer")) == [1, 2]


def test_select_prunes_largest_aimer(models):
    model = models("qwen3_moe")
    scores = score_weights(model, "aimer")
    plan = lp.select_experts(scores, 0.5)
    for layer in lp.find_moe_layers(model):
        aimer = [_ref_aimer(_expert_values(layer, e)) for e in range(layer.num_experts)]
        order = sorted(range(layer.num_experts), key=lambda e: -aimer[e])  # largest AIMER first
        expected_pruned = sorted(order[: layer.num_experts // 2])
        assert plan.pruned()[layer.index] == expected_pruned
        assert max(aimer[e] for e in plan.keep[layer.index]) < min(aimer[e] for e in expected_pruned)


def test_weight_reads_do_not_track_gradients(fresh_qwen3):
    scores = score_weights(fresh_qwen3, "aimer")
    assert all(not v.requires_grad for v in scores.values())
    assert all(v.device.type == "cpu" and v.dtype == torch.float64 for v in scores.values())


# ----------------------------------------------------------------------------- registry
def test_builtins_registered_and_lazy_top_level():
    assert set(WEIGHT_CRITERIA) <= set(available_criteria())
    assert set(WEIGHT_CRITERIA) <= set(available_criteria(needs_data=False))
    assert lp.available_criteria is available_criteria
    assert lp.get_criterion is get_criterion
    assert lp.register_criterion is register_criterion
    from lightprune.experts.criteria import score_weights as model_or_checkpoint

    assert lp.score_weights is model_or_checkpoint  # a model, or a checkpoint directory streamed
    assert isinstance(get_criterion("aimer"), AIMER)
    assert get_criterion(AIMER).name == "aimer"
    instance = AIMER()
    assert get_criterion(instance) is instance
    assert repr(get_criterion("random", seed=4)) == "RandomCriterion(seed=4)"


def test_unknown_name_lists_available(models):
    with pytest.raises(ValueError, match="unknown criterion 'nope'") as err:
        get_criterion("nope")
    for name in WEIGHT_CRITERIA:
        assert name in str(err.value)
    with pytest.raises(ValueError, match="aimer"):
        score_weights(models("qwen3_moe"), "nope")


def test_bad_constructor_arguments():
    with pytest.raises(TypeError, match="seed"):
        get_criterion("random", bogus=1)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        get_criterion("random", seed=-1)
    with pytest.raises(TypeError, match="seed must be an int"):
        get_criterion("random", seed="3")
    with pytest.raises(ValueError, match="block_elements"):
        get_criterion("aimer", block_elements=0)
    with pytest.raises(ValueError, match="already built"):
        get_criterion(AIMER(), block_elements=5)


def test_duplicate_and_invalid_registration(registry_guard):
    with pytest.raises(ValueError, match="already registered"):
        @register_criterion("aimer")
        class Other(Criterion):
            pass
    assert get_criterion("aimer").__class__ is AIMER
    register_criterion("aimer")(AIMER)  # the same class again is fine
    for bad in ("Bad Name", "", "1abc", "a.b", 3):
        with pytest.raises(ValueError, match="snake case"):
            register_criterion(bad)
    with pytest.raises(TypeError, match="must be a Criterion subclass"):
        register_criterion("not_a_criterion")(dict)


def test_user_defined_criterion(models, registry_guard):
    @register_criterion("first_row_abs")
    class FirstRowAbs(Criterion):
        """|router weight[e, 0]| scaled by a typed factor."""

        def __init__(self, factor: float = 1.0, seed: int = 0):
            self.factor = float(factor)
            self.seed = seed

        def score_layer(self, layer):
            return layer.router.weight[:, 0].abs() * self.factor + self.seed

    model = models("olmoe")
    assert "first_row_abs" in lp.available_criteria()
    scores = lp.score_weights(model, "first_row_abs", factor=2.0, seed=1)
    assert scores.criterion == "first_row_abs"
    for layer in lp.find_moe_layers(model):
        expected = [2.0 * abs(x) + 1.0 for x in layer.router.weight[:, 0].double().tolist()]
        _assert_close(scores[layer.index], expected, rtol=1e-6)
    plan = lp.select_experts(scores, 0.25)
    assert plan.criterion == "first_row_abs"
    assert lp.score_weights(model, FirstRowAbs).criterion == "first_row_abs"


def test_dotted_import_path(models):
    scores = score_weights(models("olmoe"), "lightprune.experts.criteria.magnitude.Magnitude")
    assert scores.criterion == "magnitude"
    with pytest.raises(ValueError, match="cannot import"):
        get_criterion("lightprune.experts.criteria.nothing_here.Nope")
    with pytest.raises(TypeError, match=r"criterion 'torch.nn.Linear' is not a registered criterion name or a "
                                        r"Criterion subclass \(it is <class 'torch.nn.modules.linear.Linear'>\); it "
                                        "was not built"):
        get_criterion("torch.nn.Linear")


def test_data_criterion_points_to_calibration(models, registry_guard):
    @register_criterion("needs_batches")
    class NeedsBatches(Criterion):
        needs_data = True

    assert "needs_batches" in available_criteria(needs_data=True)
    assert "needs_batches" not in available_criteria(needs_data=False)
    model = models("qwen3_moe")
    with pytest.raises(CriterionNeedsDataError, match="calibration") as err:
        score_weights(model, "needs_batches")
    assert "collect_expert_stats" in str(err.value)
    with pytest.raises(CriterionNeedsDataError):
        score_weights(model, NeedsBatches())


def test_score_layer_shape_checked(models, registry_guard):
    @register_criterion("wrong_shape")
    class WrongShape(Criterion):
        def score_layer(self, layer):
            return torch.zeros(layer.num_experts + 1)

    with pytest.raises(ValueError, match="expected"):
        score_weights(models("qwen3_moe"), "wrong_shape")


def test_non_moe_model_is_an_error():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, vocab_size=32))
    with pytest.raises(ValueError, match="unsupported model_type"):
        score_weights(model, "aimer")


def test_criteria_that_need_data_share_the_registry_and_score_from_the_run(tiny):
    from fixtures import padded_batch, scores_for_layers

    from lightprune.experts.calibration import CRITERIA
    from lightprune.models import find_moe_layers

    assert set(lp.available_criteria(needs_data=True)) == set(CRITERIA) | {"maep", "router_delta", "hc_smoe", "m_smoe"}
    assert not set(lp.available_criteria(needs_data=True)) & set(lp.available_criteria(needs_data=False))
    model = tiny("qwen3_moe")
    stats = lp.collect_expert_stats(model, [padded_batch(seed=s) for s in range(2)], subsets=("all", "text"),
                                    progress=False)
    for name in ("frequency", "seer", "ean", "reap", "routing_kl", "delta_h"):
        for subset in ("all", "text"):
            got = lp.get_criterion(name, subset=subset).score_in_run(model, stats, {})
            want = stats.score(name, subset)
            assert got.criterion == name and set(got) == set(want)
            for layer in want:
                assert torch.equal(got[layer], want[layer])
    with pytest.raises(ValueError, match="'reap' needs calibration statistics: add an ExpertStats callback"):
        lp.get_criterion("reap").score_in_run(model, None, {})
    with pytest.raises(CriterionNeedsDataError, match="'reap' needs calibration data"):
        lp.score_weights(model, "reap")
    with pytest.raises(ValueError, match="subset must be one of .* got 'audio'"):
        lp.get_criterion("reap", subset="audio")
    fitted = scores_for_layers(find_moe_layers(model))
    assert lp.get_criterion("router_delta").score_in_run(model, None, {"router_delta": fitted}) is fitted
    with pytest.raises(ValueError, match="measured by the RouterDelta callback during `lightprune fit`"):
        lp.get_criterion("router_delta").score_in_run(model, stats, {})
    # a weight criterion asked in a run reads the weights, whatever the run holds
    aimer = lp.get_criterion("aimer")
    assert all(torch.equal(a, b) for a, b in zip(aimer.score_in_run(model, stats, {"aimer": fitted}).values(),
                                                  aimer.score(model).values()))

"""MAEP combination (MAEP ("Modality-Aware Expert Pruning for MoE-Based Multimodal Large Language Models", arXiv
2611.05927), section 5.3): Spearman, closed-form alpha, s = (1-a) z_t - a z_la, plans.

Every expected value is recomputed here independently of lightprune: Spearman by brute-force
average ranks (and scipy when installed), rhos of constructed rankings from 1 - 6 sum d^2 /
(n (n^2 - 1)), z-scores in numpy float64, global plans by a plain sort over (layer, expert).
"""

from __future__ import annotations

import json
import math
import re
import warnings

import numpy as np
import pytest
import torch
from fixtures import greedy_global

import lightprune as lp
from lightprune.experts.calibration.result import CalibrationStats
from lightprune.experts.maep import AlphaReport, maep_alpha, maep_plan, maep_scores, spearman
from lightprune.models.layer import RoutingLimits

EPS = 1e-8
T, V, LA = "text", "vision", "vision_low_attn"


# ----------------------------------------------------------------------------- helpers
def brute_spearman(a, b) -> float:
    """Average ranks by counting (rank = #smaller + (#equal + 1) / 2), then Pearson of the ranks."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)

    def ranks(x):
        return np.array([(x < v).sum() + ((x == v).sum() + 1) / 2.0 for v in x])

    ra, rb = ranks(a) - ranks(a).mean(), ranks(b) - ranks(b).mean()
    den = math.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float("nan") if den == 0 else float((ra * rb).sum() / den)


def rho_of_permutations(p, q) -> float:
    """Spearman of two tie-free rankings: 1 - 6 sum d^2 / (n (n^2 - 1))."""
    p, q = np.asarray(p), np.asarray(q)
    n = len(p)
    return 1.0 - 6.0 * float(((p - q) ** 2).sum()) / (n * (n * n - 1))


def dh_from_ranks(ranks, scale: float) -> torch.Tensor:
    """Positive, heavy-tailed Delta-H values whose order is ``ranks`` (1 = smallest)."""
    return torch.tensor([scale * 3.0 ** float(r) for r in ranks], dtype=torch.float64)


def make_stats(per_subset: dict[str, dict[int, torch.Tensor]], top_k: int = 2, num: int | None = None,
               criterion: str = "delta_h") -> CalibrationStats:
    values = {(criterion, subset): layers for subset, layers in per_subset.items()}
    first = next(iter(per_subset.values()))
    limits = {l: RoutingLimits(num or v.numel(), top_k) for l, v in first.items()}
    return CalibrationStats(values=values, limits=limits)


def random_stats(layers=(0, 1, 3), num: int = 8, seed: int = 0, top_k: int = 2) -> CalibrationStats:
    """Log-normal Delta-H with layer scales 10^0 .. 10^4 (the paper's cross-layer spread)."""
    gen = np.random.default_rng(seed)
    per = {}
    for subset in (T, V, LA):
        per[subset] = {l: torch.from_numpy(10.0 ** (i * 2) * np.exp(gen.normal(0.0, 2.0, num)))
                       for i, l in enumerate(layers)}
    return make_stats(per, top_k=top_k)


def np_zscore(x) -> np.ndarray:
    logs = np.log(np.asarray(x, dtype=np.float64) + EPS)
    if (logs == logs[0]).all():  # constant layer: no ranking information -> 0
        return np.zeros_like(logs)
    return (logs - logs.mean()) / logs.std(ddof=0)


def np_s(stats: CalibrationStats, alpha: float) -> dict[int, np.ndarray]:
    t, la = stats.raw("delta_h", T), stats.raw("delta_h", LA)
    return {l: (1.0 - alpha) * np_zscore(t[l].numpy()) - alpha * np_zscore(la[l].numpy()) for l in t}



# Rankings of 6 experts with known Spearman rho (tie-free).
R = [3, 1, 6, 2, 5, 4]
REV = [7 - r for r in R]                       # reversed order: rho(R, REV) = -1
SWAP = [1, 3, 6, 2, 5, 4]                      # R with ranks 1 and 3 exchanged: rho 1 - 48/210
P4 = [2, 1, 3, 4, 6, 5]
P5 = [3, 2, 6, 1, 4, 5]
# rho between 0.31 and 0.89 per pair; means (0.829, 0.300, 0.357) -> a = 0.529, b = 0.357, alpha = 0.597
PARTIAL = [(R, SWAP, P4), (R, R, P5), (SWAP, P5, R), (R, SWAP, REV)]


# ----------------------------------------------------------------------------- spearman
def test_spearman_known_values():
    assert spearman(R, R) == pytest.approx(1.0, abs=1e-15)
    assert spearman(R, REV) == pytest.approx(-1.0, abs=1e-15)
    assert spearman([1e-12, 2e-9, 5.0], [0.0, 1.0, 1e6]) == pytest.approx(1.0)  # ranks only
    # ties by hand: ranks [1, 2.5, 2.5, 4] vs [1, 2, 3, 4] -> 4.5 / sqrt(4.5 * 5)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(22.5), abs=1e-15)
    assert spearman(R, SWAP) == pytest.approx(rho_of_permutations(R, SWAP), abs=1e-15)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("n", [2, 3, 7, 64])
def test_spearman_matches_independent_implementations_with_ties(seed, n):
    gen = np.random.default_rng(seed)
    a = gen.integers(0, max(2, n // 3), n).astype(np.float64)    # many ties
    b = gen.normal(size=n) if seed % 2 else gen.integers(0, 3, n).astype(np.float64)
    expected = brute_spearman(a, b)
    got = spearman(torch.from_numpy(a).float(), torch.from_numpy(b))
    if math.isnan(expected):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(expected, abs=1e-12)
    try:
        from scipy.stats import spearmanr
    except ImportError:  # pragma: no cover - scipy is optional
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = float(spearmanr(a, b).statistic)
    if math.isnan(ref):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(ref, abs=1e-12)


def test_spearman_constant_vector_is_nan():
    """Rule: a constant vector (or a single value) has no ranking -> NaN, as scipy gives."""
    assert math.isnan(spearman([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]))
    assert math.isnan(spearman([1.0, 2.0, 3.0], [0.0, 0.0, 0.0]))
    assert math.isnan(spearman([5.0], [1.0]))


def test_spearman_rejects_bad_input():
    with pytest.raises(ValueError, match="equally long"):
        spearman([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="NaN or inf"):
        spearman([1.0, float("nan"), 3.0], [1, 2, 3])


# ----------------------------------------------------------------------------- alpha
def constructed_stats(layers: list[tuple[list, list, list]], top_k: int = 2) -> CalibrationStats:
    """One (text, vision, low) ranking triple per layer; each layer and subset its own magnitude."""
    per = {T: {}, V: {}, LA: {}}
    for l, (t, v, la) in enumerate(layers):
        per[T][l] = dh_from_ranks(t, 10.0 ** l)
        per[V][l] = dh_from_ranks(v, 1e-3 * 10.0 ** (2 * l))
        per[LA][l] = dh_from_ranks(la, 1e-6 * 7.0 ** l)
    return make_stats(per, top_k=top_k)


def expected_alpha(layers):
    tv = np.mean([rho_of_permutations(t, v) for t, v, _ in layers])
    tla = np.mean([rho_of_permutations(t, la) for t, _, la in layers])
    vla = np.mean([rho_of_permutations(v, la) for _, v, la in layers])
    a, b = tv - tla, vla
    return a / (a + b), a, b, (tv, tla, vla)


def test_alpha_from_identical_and_reversed_rankings():
    # per layer (rho_tv, rho_tla, rho_vla): (1, 1, 1), (1, -1, -1), (-1, -1, 1)
    layers = [(R, R, R), (R, R, REV), (R, REV, REV)]
    stats = constructed_stats(layers)
    report = maep_alpha(stats)
    assert report.rho_tv == {0: pytest.approx(1.0), 1: pytest.approx(1.0), 2: pytest.approx(-1.0)}
    assert report.rho_tla == {0: pytest.approx(1.0), 1: pytest.approx(-1.0), 2: pytest.approx(-1.0)}
    assert report.rho_vla == {0: pytest.approx(1.0), 1: pytest.approx(-1.0), 2: pytest.approx(1.0)}
    # means 1/3, -1/3, 1/3 -> a = 2/3, b = 1/3 -> alpha = 2/3
    assert (report.a, report.b) == (pytest.approx(2 / 3), pytest.approx(1 / 3))
    assert report.alpha == pytest.approx(2 / 3) and report.source == "closed_form"
    imp, alpha = lp.maep_scores(stats)
    assert alpha == pytest.approx(2 / 3) and imp.alpha_report.alpha == alpha


def test_alpha_with_partial_agreement_matches_formula():
    layers = PARTIAL
    alpha, a, b, (tv, tla, vla) = expected_alpha(layers)
    assert 0.5 < alpha < 0.7 and a > 0 and b > 0  # the construction gives an interior alpha
    report = maep_alpha(constructed_stats(layers))
    assert report.mean_rho_tv == pytest.approx(tv, abs=1e-12)
    assert report.mean_rho_tla == pytest.approx(tla, abs=1e-12)
    assert report.mean_rho_vla == pytest.approx(vla, abs=1e-12)
    assert report.a == pytest.approx(a, abs=1e-12) and report.b == pytest.approx(b, abs=1e-12)
    assert report.alpha == pytest.approx(alpha, abs=1e-12)


def test_alpha_outside_unit_interval_raises_naming_a_b_and_value():
    stats = constructed_stats([(R, R, REV)])  # a = 1 - (-1) = 2, b = -1 -> alpha = 2
    with pytest.raises(ValueError) as err:
        lp.maep_scores(stats)
    msg = str(err.value)
    assert "alpha = a / (a + b) = 2 " in msg and "outside [0, 1]" in msg
    assert "a = rho(t,v) - rho(t,la) = 2" in msg and "b = rho(v,la) = -1" in msg
    assert "pass alpha explicitly" in msg


def test_alpha_with_a_plus_b_zero_raises():
    # (1,1,1), (1,-1,-1), (-1,-1,1), (-1,1,-1): every mean rho is 0 -> a = b = 0
    stats = constructed_stats([(R, R, R), (R, R, REV), (R, REV, REV), (R, REV, R)])
    with pytest.raises(ValueError, match=r"a \+ b = 0") as err:
        maep_alpha(stats)
    assert "a = rho(t,v) - rho(t,la) = 0" in str(err.value) and "pass alpha explicitly" in str(err.value)


def test_given_alpha_bypasses_the_check_and_reports_the_closed_form():
    stats = constructed_stats([(R, R, REV)])  # closed form 2 (invalid)
    imp, alpha = lp.maep_scores(stats, alpha=0.4)
    assert alpha == 0.4
    rep = imp.alpha_report
    assert rep.source == "given" and rep.alpha == 0.4
    assert rep.closed_form == pytest.approx(2.0) and rep.a == pytest.approx(2.0) and rep.b == pytest.approx(-1.0)
    unchecked = maep_alpha(stats, check=False)
    assert unchecked.alpha == pytest.approx(2.0)


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan"), "half"])
def test_given_alpha_outside_unit_interval_raises_naming_it(bad):
    stats = random_stats()
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        lp.maep_scores(stats, alpha=bad)


def test_negative_a_and_b_inside_unit_interval_warns():
    # (1,1,1), (-1,1,-1): means tv 0, tla 1, vla 0 -> a = -1, b = 0 -> alpha = 1, a < 0
    stats = constructed_stats([(R, R, R), (R, REV, R)])
    with pytest.warns(UserWarning, match="not both"):
        report = maep_alpha(stats)
    assert report.alpha == pytest.approx(1.0) and report.a == pytest.approx(-1.0)


def test_alpha_report_to_dict_is_plain_json():
    stats = constructed_stats([(R, R, R), (R, R, REV), (R, REV, REV)])
    d = maep_alpha(stats).to_dict()
    text = json.dumps(d, allow_nan=False)
    back = json.loads(text)
    assert back["alpha"] == pytest.approx(2 / 3) and back["a"] == pytest.approx(2 / 3)
    assert back["rho_tv"] == {"0": pytest.approx(1.0), "1": pytest.approx(1.0), "2": pytest.approx(-1.0)}
    assert back["subsets"] == {"text": T, "vision": V, "low": LA}
    assert json.dumps(AlphaReport(alpha=0.5, source="given").to_dict(), allow_nan=False)  # NaN -> null


def test_missing_vision_subset_needs_alpha():
    stats = random_stats()
    only = make_stats({T: stats.raw("delta_h", T), LA: stats.raw("delta_h", LA)})
    with pytest.raises(KeyError, match="pass alpha explicitly"):
        lp.maep_scores(only)
    imp, alpha = lp.maep_scores(only, alpha=0.3)
    assert alpha == 0.3 and imp.alpha_report.a != imp.alpha_report.a  # NaN: no vision statistics
    assert imp.alpha_report.to_dict()["a"] is None


# ----------------------------------------------------------------------------- combination
@pytest.mark.parametrize("alpha", [0.0, 0.25, 0.8, 1.0])
def test_s_equals_independent_float64_computation(alpha):
    stats = random_stats(seed=4)
    imp, used = lp.maep_scores(stats, alpha=alpha)
    expected = np_s(stats, alpha)
    assert used == alpha and set(imp) == set(expected)
    for l, v in imp.items():
        assert v.dtype == torch.float64
        np.testing.assert_allclose(v.numpy(), expected[l], rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(imp.raw[l].numpy(), v.numpy())
    assert imp.criterion == "maep" and imp.limits == stats.limits


def test_s_with_the_closed_form_alpha():
    layers = PARTIAL
    stats = constructed_stats(layers)
    alpha = expected_alpha(layers)[0]
    imp, used = lp.maep_scores(stats)
    assert used == pytest.approx(alpha, abs=1e-12)
    for l, s in np_s(stats, alpha).items():
        np.testing.assert_allclose(imp[l].numpy(), s, rtol=1e-10, atol=1e-12)


def test_constant_layer_gives_zero_z_and_no_nan():
    """Rule: sigma_l = 0 on a subset -> z~ = 0 there; rho undefined -> layer left out of the alpha means."""
    layers = [(R, R, R), (R, R, REV), (R, REV, REV)]
    stats = constructed_stats(layers)
    per = {s: dict(stats.raw("delta_h", s)) for s in (T, V, LA)}
    per[T][3] = torch.zeros(6, dtype=torch.float64)               # no text signal in layer 3
    per[V][3] = dh_from_ranks(R, 1.0)
    per[LA][3] = dh_from_ranks(REV, 1.0)
    per[T][4] = torch.full((6,), 0.5, dtype=torch.float64)        # both terms constant in layer 4
    per[V][4] = dh_from_ranks(R, 1.0)
    per[LA][4] = torch.full((6,), 2.0, dtype=torch.float64)
    stats = make_stats(per)
    with pytest.warns(UserWarning, match=r"layers \[3, 4\]"):
        report = maep_alpha(stats)
    assert report.skipped_layers == [3, 4] and report.layers_used == [0, 1, 2]
    assert math.isnan(report.rho_tv[3]) and report.rho_vla[3] == pytest.approx(-1.0)
    assert report.alpha == pytest.approx(2 / 3)  # same as the three defined layers alone
    imp, alpha = lp.maep_scores(stats, alpha=0.3)
    for v in imp.values():
        assert torch.isfinite(v).all()
    np.testing.assert_allclose(imp[3].numpy(), -0.3 * np_zscore(per[LA][3].numpy()), rtol=1e-12)
    np.testing.assert_array_equal(imp[4].numpy(), np.zeros(6))
    json.dumps(report.to_dict(), allow_nan=False)
    plan = maep_plan(stats, 0.25, alpha=0.3)
    assert plan.total_pruned == math.floor(0.25 * 30)


@pytest.mark.parametrize("value", [0.0, 2.0, 1e-3])
def test_constant_layer_of_many_experts_is_exactly_zero(value):
    """128 equal values: the float mean of equal logs is not always the value (std ~ 1e-15), which
    must not turn into z = +-1; the layer's z~ is exactly 0."""
    n = 128
    gen = np.random.default_rng(0)
    t = {0: torch.full((n,), value, dtype=torch.float64), 1: torch.from_numpy(np.exp(gen.normal(0, 1, n)))}
    la = {0: torch.from_numpy(np.exp(gen.normal(0, 1, n))), 1: torch.from_numpy(np.exp(gen.normal(0, 1, n)))}
    stats = make_stats({T: t, LA: la})
    imp, _ = lp.maep_scores(stats, alpha=0.25)
    np.testing.assert_allclose(imp[0].numpy(), -0.25 * np_zscore(la[0].numpy()), rtol=1e-12, atol=0)
    assert float(imp[0].mean()) == pytest.approx(0.0, abs=1e-12)


def test_alpha_undefined_when_every_layer_is_constant():
    flat = {l: torch.ones(6, dtype=torch.float64) for l in range(2)}
    stats = make_stats({T: flat, V: {l: dh_from_ranks(R, 1.0) for l in range(2)}, LA: flat})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="undefined in every layer"):
            lp.maep_scores(stats)
        imp, _ = lp.maep_scores(stats, alpha=0.5)
    assert all(torch.equal(v, torch.zeros(6, dtype=torch.float64)) for v in imp.values())


def test_bad_statistics_are_named():
    stats = random_stats()
    per = {s: dict(stats.raw("delta_h", s)) for s in (T, V, LA)}
    per[LA] = {l: v for l, v in per[LA].items() if l != 3}
    with pytest.raises(ValueError, match="different layers"):
        lp.maep_scores(make_stats(per, num=8), alpha=0.5)
    per = {s: dict(stats.raw("delta_h", s)) for s in (T, V, LA)}
    per[T][1] = -per[T][1]
    with pytest.raises(ValueError, match=r"'text', layer 1: negative"):
        lp.maep_scores(make_stats(per), alpha=0.5)
    per[T][1] = torch.full((8,), float("nan"), dtype=torch.float64)
    with pytest.raises(ValueError, match=r"'text', layer 1: non-finite"):
        lp.maep_scores(make_stats(per), alpha=0.5)


def test_other_criterion_and_subset_names():
    stats = random_stats(seed=7)
    per = {(("delta_h_promoted", s)): dict(stats.raw("delta_h", s)) for s in (T, V)}
    per[("delta_h_promoted", "vision_high_attn")] = dict(stats.raw("delta_h", LA))
    other = CalibrationStats(values=per, limits=stats.limits)
    imp, _ = lp.maep_scores(other, alpha=0.2, criterion="delta_h_promoted", low_subset="vision_high_attn")
    for l, s in np_s(stats, 0.2).items():
        np.testing.assert_allclose(imp[l].numpy(), s, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- plans
def floor_binding_stats(num: int = 8, top_k: int = 4) -> CalibrationStats:
    """Layer 2: low-attention Delta-H is 1 / text, so s = z_t (wide) with five clearly low experts;
    other layers: la ~ text, so s ~ (1 - 2 alpha) z_t, compressed near 0. A plain global sort would
    take five experts from layer 2, but its floor (top_k = 4 of 8) allows four."""
    gen = np.random.default_rng(11)
    per = {T: {}, V: {}, LA: {}}
    skew = np.exp(2.0 * np.array([-1.0, 2.0, -1.1, -1.2, 1.5, -1.3, 2.5, -0.9]))
    for l in range(4):
        t = (skew if l == 2 else np.exp(gen.normal(0, 2, num))) * 10.0 ** l
        per[T][l] = torch.from_numpy(t)
        per[V][l] = torch.from_numpy(np.exp(gen.normal(0, 2, num)))
        la = 1.0 / t if l == 2 else t * np.exp(gen.normal(0, 0.05, num))
        per[LA][l] = torch.from_numpy(la)
    return make_stats(per, top_k=top_k)


@pytest.mark.parametrize("ratio", [0.25, 0.375, 0.5])
def test_global_plan_prunes_lowest_s_subject_to_floor(ratio):
    num, top_k, alpha = 8, 4, 0.45
    stats = floor_binding_stats(num, top_k)
    plan = maep_plan(stats, ratio, allocation="global", alpha=alpha)
    s = np_s(stats, alpha)
    target = math.floor(ratio * 4 * num)
    expected = greedy_global(s, target, {l: top_k for l in s})
    assert {l: set(ids) for l, ids in plan.pruned().items()} == expected
    assert plan.total_pruned == target
    naive = sorted((float(v), l, e) for l, vals in s.items() for e, v in enumerate(vals))[:target]
    assert sum(1 for _, l, _ in naive if l == 2) > num - top_k  # the floor binds in layer 2 ...
    assert plan.kept_counts()[2] == top_k                          # ... which keeps exactly top_k
    # same as the public two-step API
    imp, _ = lp.maep_scores(stats, alpha=alpha)
    assert lp.select_experts(imp, ratio, allocation="global").keep == plan.keep
    assert plan.criterion == "maep" and plan.allocation == "global"
    assert plan.metadata["alpha"] == alpha and plan.metadata["alpha_source"] == "given"
    assert plan.metadata["alpha_a"] is not None and plan.metadata["alpha_b"] is not None


def test_global_plan_with_closed_form_alpha_records_a_and_b():
    layers = [(R, R, R), (R, R, REV), (R, REV, REV)]
    stats = constructed_stats(layers, top_k=2)
    plan = maep_plan(stats, 0.5)
    md = plan.metadata
    assert md["alpha"] == pytest.approx(2 / 3) and md["alpha_source"] == "closed_form"
    assert md["alpha_a"] == pytest.approx(2 / 3) and md["alpha_b"] == pytest.approx(1 / 3)
    assert md["alpha_closed_form"] == pytest.approx(2 / 3)
    s = np_s(stats, 2 / 3)
    assert {l: set(ids) for l, ids in plan.pruned().items()} == greedy_global(s, 9, {l: 2 for l in s})
    back = lp.ExpertPlan.from_dict(json.loads(json.dumps(plan.to_dict(), allow_nan=False)))
    assert back.keep == plan.keep and back.metadata["alpha"] == pytest.approx(2 / 3)


def test_uniform_plan_and_the_paper_alpha_note():
    stats = random_stats(seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = maep_plan(stats, 0.5, allocation="uniform", alpha=0.5)  # the paper's uniform alpha: no warning
    s = np_s(stats, 0.5)
    expected = {l: set(np.argsort(v, kind="stable")[:4].tolist()) for l, v in s.items()}
    assert {l: set(ids) for l, ids in plan.pruned().items()} == expected
    assert plan.allocation == "uniform" and plan.is_uniform
    stats = constructed_stats([(R, R, R), (R, R, REV), (R, REV, REV)])
    with pytest.warns(UserWarning, match="alpha = 0.5"):
        maep_plan(stats, 0.5, allocation="uniform")


def test_public_api():
    assert "maep_scores" in lp.__all__
    assert lp.maep_scores is maep_scores

"""collect_expert_stats against a brute-force reference, and the observer's guarantees.

The reference does not use lightprune.experts.calibration at all. Pre-hooks on every MoE layer's experts
record the hidden states entering them in the observed pass itself (so both sides see the same
tokens); the routing comes from the family's own router module (``layer.router(h)``) and, for
Delta-H, from the family's masked routing ``layer.route(h, mask)`` (checked against hand-written
routing in test_models.py). Everything else is plain float64 loops over tokens: every expert's MLP
is evaluated by hand from the fused weights (act(gate) * up, then down), H = sum_S w_i f_i(h),
H^(-j) = sum over S' n S of w'_i f_i(h) (plus the promoted experts for delta_h_promoted), the
router distribution p is softmax(logits) (sigmoid scores / their sum for DeepSeek-V3) and
KL(p || p^(-j)) gets Laplace smoothing eps = 1e-12 on both sides.

A second, fully analytic reference for the softmax families re-derives Delta-H from the paper's
closed forms (MAEP eq. 2: w_i / (1 - w_j + w_(k+1)) with renormalisation, p_i / (1 - p_j) without),
in float64 from the router logits, with no call into lightprune's routing.

Tolerances: the code under test runs the experts in fp32 and accumulates in float64, the
reference runs them in float64. Counts are compared exactly, sums of the router's fp32 weights to
1e-12, the expert-output criteria to 2e-5 relative (fp32 matmuls over 32/16-wide dot products).
"""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from fixtures import logits_of

import lightprune as lp
from lightprune.experts.calibration import CRITERIA, DEFAULT_CRITERIA, ExpertObserver
from lightprune.models import find_moe_layers

EPS = 1e-12
ALL_CRITERIA = list(CRITERIA)

# (family, overrides): softmax with renormalisation, softmax without, group-limited sigmoid
VARIANTS = [
    pytest.param("qwen3_moe", dict(norm_topk_prob=True), id="qwen3_moe-renorm"),
    pytest.param("mixtral", {}, id="mixtral"),
    pytest.param("olmoe", dict(norm_topk_prob=False), id="olmoe-no-renorm"),
    pytest.param("qwen2_moe", dict(norm_topk_prob=False), id="qwen2_moe-shared-no-renorm"),
    pytest.param("deepseek_v3", {}, id="deepseek_v3"),
    pytest.param("deepseek_v3", dict(n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=3),
                 id="deepseek_v3-4groups-top3"),
    # 64 experts: Delta-H re-runs the selection only where a removal can change it (each router's closed form)
    pytest.param("mixtral", dict(num_local_experts=64, num_experts_per_tok=4), id="mixtral-64"),
    pytest.param("olmoe", dict(num_experts=64, num_experts_per_tok=8, norm_topk_prob=False), id="olmoe-64-no-renorm"),
    pytest.param("deepseek_v3", dict(n_routed_experts=64, n_group=8, topk_group=3, num_experts_per_tok=6),
                 id="deepseek_v3-64-8groups"),
    pytest.param("deepseek_v2", dict(n_routed_experts=64, n_group=8, topk_group=3, num_experts_per_tok=6),
                 id="deepseek_v2-64-group-limited"),
    # DeepSeek-V3's own shape: groups that drop out are replaced in closed form (both top-2 experts at once)
    pytest.param("deepseek_v3", dict(n_routed_experts=256, n_group=8, topk_group=4, num_experts_per_tok=8),
                 id="deepseek_v3-256-8groups-4chosen"),
]


# ----------------------------------------------------------------------------- batches
def make_batch(rows: int, seq: int, seed: int, pads: dict[int, tuple[int, int]] = ()) -> dict[str, torch.Tensor]:
    """Random ids; ``pads[row] = (left, right)`` padding (id 0, attention 0) on that row."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 100, (rows, seq), generator=gen)
    attention = torch.ones(rows, seq, dtype=torch.long)
    for row, (left, right) in dict(pads).items():
        attention[row, :left] = 0
        if right:
            attention[row, seq - right:] = 0
    ids[attention == 0] = 0
    return {"input_ids": ids, "attention_mask": attention}


def calibration_batches() -> list[dict[str, torch.Tensor]]:
    """Left and right padding, a fully padded row (a sample with no tokens) and an unpadded batch."""
    return [
        make_batch(2, 9, seed=1, pads={0: (0, 2), 1: (3, 0)}),
        make_batch(3, 7, seed=2, pads={0: (1, 1), 1: (0, 7)}),
        make_batch(1, 6, seed=3),
    ]


# ----------------------------------------------------------------------------- capture
class Capture:
    """Forward pre-/post-hooks on every MoE layer's experts: (hidden, ids, weights, output) per call."""

    def __init__(self, layers):
        self.calls = {layer.index: [] for layer in layers}
        self.handles = []
        for layer in layers:
            self.handles.append(layer.experts.register_forward_hook(self._make_hook(layer.index)))

    def _make_hook(self, index):
        def hook(module, args, output):
            assert len(args) == 3, "experts are called as experts(hidden, top_k_index, top_k_weights)"
            self.calls[index].append(tuple(a.detach().clone() for a in args) + (output.detach().clone(),))
        return hook

    def remove(self):
        for handle in self.handles:
            handle.remove()


def collect_with_capture(model, batches, **kw):
    layers = find_moe_layers(model)
    capture = Capture(layers)
    try:
        stats = lp.collect_expert_stats(model, batches, progress=False, **kw)
    finally:
        capture.remove()
    return stats, capture.calls


# ----------------------------------------------------------------------------- brute force
def expert_mlp(experts, index: int, x: torch.Tensor) -> torch.Tensor:
    """Expert ``index``'s unweighted output on one token, float64, from the fused weights."""
    assert not getattr(experts, "is_transposed", False) and not getattr(experts, "has_bias", False)
    assert getattr(experts, "is_concatenated", True) and getattr(experts, "has_gate", True)
    gate_up = experts.gate_up_proj[index].detach().double() @ x          # [2I]
    inter = gate_up.shape[0] // 2
    gate, up = gate_up[:inter], gate_up[inter:]
    return experts.down_proj[index].detach().double() @ (experts.act_fn(gate) * up)


def router_probs(model_type: str, logits: torch.Tensor) -> list[float]:
    """p over all experts for one token: softmax, or normalised sigmoid scores for DeepSeek-V3."""
    z = [float(v) for v in logits]
    if model_type == "deepseek_v3":
        s = [1.0 / (1.0 + math.exp(-v)) for v in z]
    else:
        top = max(z)
        s = [math.exp(v - top) for v in z]
    total = sum(s)
    return [v / total for v in s]


def smoothed_kl(p: list[float], j: int) -> float:
    """KL(p || p^(-j)): p^(-j) zeroes p_j and renormalises; eps added to both sides, then renormalised."""
    rest = sum(v for i, v in enumerate(p) if i != j)
    q = [0.0 if i == j else v / rest for i, v in enumerate(p)]
    ps = [v + EPS for v in p]
    qs = [v + EPS for v in q]
    zp, zq = sum(ps), sum(qs)
    return sum(a / zp * math.log((a / zp) / (b / zq)) for a, b in zip(ps, qs))


def one_hot(num: int, j: int) -> torch.Tensor:
    mask = torch.zeros(num, dtype=torch.bool)
    mask[j] = True
    return mask


def brute_force(model, batches, calls) -> dict:
    """{(criterion, layer): tensor[E]} plus "tokens"/"samples", by per-token loops in float64."""
    model_type = model.config.model_type
    out: dict = {}
    for layer in find_moe_layers(model):
        num = layer.num_experts
        freq, seer, ean, reap_num, kl = ([0.0] * num for _ in range(5))
        dh, dhp = [0.0] * num, [0.0] * num
        tokens = samples = 0
        assert len(calls[layer.index]) == len(batches)
        for batch, (hidden, given_ids, given_w, given_out) in zip(batches, calls[layer.index]):
            with torch.no_grad():
                logits, weights, selected = layer.router(hidden)       # the family's own router
                # the routing the experts were handed is the router's
                assert torch.equal(selected, given_ids) and torch.equal(weights, given_w)
                rerouted = [layer.route(hidden, one_hot(num, j)) for j in range(num)]
            valid = batch["attention_mask"].bool()
            rows, seq = valid.shape
            assert hidden.shape[0] == rows * seq
            h64 = hidden.double()
            for b in range(rows):
                toks = [b * seq + s for s in range(seq) if valid[b, s]]
                if not toks:
                    continue
                samples += 1
                sample_dh, sample_dhp = [0.0] * num, [0.0] * num
                for t in toks:
                    tokens += 1
                    f = [expert_mlp(layer.experts, i, h64[t]) for i in range(num)]
                    sel = selected[t].tolist()
                    w = weights[t].double().tolist()
                    for i, wi in zip(sel, w):
                        norm = float(f[i].norm())
                        freq[i] += 1
                        seer[i] += wi
                        ean[i] += norm
                        reap_num[i] += wi * norm
                    H = sum(wi * f[i] for i, wi in zip(sel, w))
                    # the MoE block's experts output is this H (the reference models the real block)
                    torch.testing.assert_close(H, given_out[t].double(), rtol=1e-5, atol=1e-5)
                    p = router_probs(model_type, logits[t])
                    for j in range(num):
                        kl[j] += smoothed_kl(p, j)
                        _, w_new, s_new = rerouted[j]
                        assert j not in s_new[t].tolist()
                        new = list(zip(s_new[t].tolist(), w_new[t].double().tolist()))
                        survivors = sum((wi * f[i] for i, wi in new if i in sel), torch.zeros_like(H))
                        promoted = sum((wi * f[i] for i, wi in new if i not in sel), torch.zeros_like(H))
                        sample_dh[j] += float((H - survivors).pow(2).sum())
                        sample_dhp[j] += float((H - survivors - promoted).pow(2).sum())
                for j in range(num):
                    dh[j] += sample_dh[j] / len(toks)
                    dhp[j] += sample_dhp[j] / len(toks)
        t64 = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
        out[("frequency", layer.index)] = t64(freq)
        out[("seer", layer.index)] = t64(seer)
        out[("ean", layer.index)] = t64(ean)
        out[("reap", layer.index)] = t64([r / n if n else 0.0 for r, n in zip(reap_num, freq)])
        out[("routing_kl", layer.index)] = t64(kl) / tokens
        out[("delta_h", layer.index)] = t64(dh) / samples
        out[("delta_h_promoted", layer.index)] = t64(dhp) / samples
        out[("tokens", layer.index)] = tokens
        out[("samples", layer.index)] = samples
    return out


#: per-token values are float32 (batch sums added to float64): float32 rounding, and for the reference's float64 norms
TOLERANCE = {
    "frequency": dict(rtol=0, atol=0),
    "seer": dict(rtol=1e-6, atol=1e-9),
    "routing_kl": dict(rtol=2e-5, atol=1e-9),
    "ean": dict(rtol=2e-5, atol=1e-7),
    "reap": dict(rtol=2e-5, atol=1e-7),
    "delta_h": dict(rtol=2e-5, atol=1e-9),
    "delta_h_promoted": dict(rtol=2e-5, atol=1e-9),
}


def assert_matches(stats, reference, subsets=("all", "text")):
    layers = sorted({key[1] for key in reference})
    for name in ALL_CRITERIA:
        for subset in subsets:
            got = stats.raw(name, subset)
            assert sorted(got) == layers
            for index in layers:
                torch.testing.assert_close(got[index], reference[(name, index)], **TOLERANCE[name],
                                           msg=lambda m: f"{name}/{subset} layer {index}: {m}")
    for subset in subsets:
        assert stats.tokens[subset] == reference[("tokens", layers[0])]
        assert stats.samples[subset] == reference[("samples", layers[0])]


# ----------------------------------------------------------------------------- against the brute force
@pytest.mark.parametrize("family,overrides", VARIANTS)
def test_every_criterion_equals_a_brute_force_reference(tiny, family, overrides):
    model = tiny(family, **overrides)
    batches = calibration_batches()
    stats, calls = collect_with_capture(model, batches, subsets=("all", "text"), criteria=ALL_CRITERIA)
    reference = brute_force(model, batches, calls)
    # padding excluded: 7 + 6 tokens, 4 + 0 + 3 ... the fully padded row is no sample
    valid = sum(int(b["attention_mask"].sum()) for b in batches)
    assert stats.tokens == {"all": valid, "text": valid}
    assert stats.samples == {"all": 5, "text": 5}
    assert_matches(stats, reference)
    # the experts saw the hidden states of the model's own pass (the observing implementation is exact)
    plain = Capture(find_moe_layers(model))
    try:
        for batch in batches:
            logits_of(model, batch)
    finally:
        plain.remove()
    for index, seen in calls.items():
        for (h_obs, *_), (h_plain, *_) in zip(seen, plain.calls[index]):
            torch.testing.assert_close(h_obs, h_plain, rtol=1e-5, atol=1e-5)


def test_text_subset_equals_all_on_a_text_only_model(tiny):
    model = tiny("qwen2_moe")
    stats = lp.collect_expert_stats(model, calibration_batches(), subsets=("all", "text"), criteria=ALL_CRITERIA,
                                    progress=False)
    assert stats.subsets == ("all", "text")
    for name in ALL_CRITERIA:
        a, t = stats.raw(name, "all"), stats.raw(name, "text")
        assert sorted(a) == sorted(t)
        for index in a:
            assert torch.equal(a[index], t[index]), (name, index)


def test_default_criteria_leave_out_the_promoted_variant_and_agree_with_all(tiny):
    model = tiny("qwen3_moe")
    batches = calibration_batches()
    default = lp.collect_expert_stats(model, batches, progress=False)
    full = lp.collect_expert_stats(model, batches, criteria=ALL_CRITERIA, progress=False)
    assert default.criteria == DEFAULT_CRITERIA and "delta_h_promoted" not in default.criteria
    assert default.subsets == ("all",)
    with pytest.raises(KeyError, match="delta_h_promoted"):
        default.raw("delta_h_promoted")
    for name in DEFAULT_CRITERIA:
        for index, value in default.raw(name).items():
            # with delta_h_promoted the entering experts run in the forward's grouped matmuls, which may round the
            # routed rows (and so the next layers) in the last bits
            torch.testing.assert_close(value, full.raw(name)[index], rtol=1e-5, atol=1e-9, msg=f"{name} {index}")
            assert torch.equal(default.score(name)[index], value)     # importance = raw for text subsets
    only = lp.collect_expert_stats(model, batches, criteria=["reap"], progress=False)
    assert only.criteria == ("reap",)
    for index, value in only.raw("reap").items():
        assert torch.equal(value, default.raw("reap")[index])  # no promoted experts run: the same forward
        torch.testing.assert_close(value, full.raw("reap")[index], rtol=1e-5, atol=1e-9)


# ----------------------------------------------------------------------------- Delta-H semantics
def single_token_batch() -> dict[str, torch.Tensor]:
    """Two samples of one real token each (one left-, one right-padded): at most 2k experts routed."""
    return make_batch(2, 6, seed=7, pads={0: (5, 0), 1: (0, 5)})


@pytest.mark.parametrize("family,overrides,renorm", [
    ("qwen3_moe", dict(norm_topk_prob=True), True),
    ("mixtral", {}, True),
    ("qwen2_moe", dict(norm_topk_prob=False), False),
    ("olmoe", dict(norm_topk_prob=False), False),
])
def test_tokens_not_routed_to_an_expert(tiny, family, overrides, renorm):
    """Softmax-renorm: masking an expert a token does not use leaves its top-k weights as they were,
    so dh = 0 (up to the fp32 rounding of the re-run routing). Without renormalisation every weight
    scales by 1 / (1 - p_j), so the token still contributes: dh > 0."""
    model = tiny(family, **overrides)
    stats = lp.collect_expert_stats(model, [single_token_batch()], criteria=ALL_CRITERIA, progress=False)
    freq, dh = stats.raw("frequency"), stats.raw("delta_h")
    checked = 0
    for index in freq:
        unrouted = freq[index] == 0
        assert unrouted.sum() >= 2 and (~unrouted).any()          # the case exists in every layer
        routed_scale = dh[index][~unrouted].max()
        assert routed_scale > 0
        if renorm:
            # mathematically exactly 0; the re-run fp32 softmax moves the renormalised weights by ~1 ulp
            assert (dh[index][unrouted] <= 1e-12 * routed_scale).all(), dh[index]
        else:
            assert (dh[index][unrouted] > 0).all(), dh[index]
        checked += int(unrouted.sum())
    assert checked >= 4


def analytic_delta_h(model, batches, calls, promoted: bool = False) -> dict[int, torch.Tensor]:
    """MAEP eq. 2 from the paper's closed forms, float64 from the router logits (softmax families only)."""
    renorm = model.config.model_type == "mixtral" or bool(model.config.norm_topk_prob)
    out = {}
    for layer in find_moe_layers(model):
        num, k = layer.num_experts, layer.top_k
        total, samples = torch.zeros(num, dtype=torch.float64), 0
        for batch, (hidden, *_) in zip(batches, calls[layer.index]):
            logits = hidden.double() @ layer.router.weight.detach().double().T
            p = torch.softmax(logits, dim=-1)
            valid = batch["attention_mask"].bool()
            rows, seq = valid.shape
            for b in range(rows):
                toks = [b * seq + s for s in range(seq) if valid[b, s]]
                if not toks:
                    continue
                samples += 1
                acc = torch.zeros(num, dtype=torch.float64)
                for t in toks:
                    order = torch.argsort(p[t], descending=True).tolist()
                    sel, nxt = order[:k], order[k]
                    f = {i: expert_mlp(layer.experts, i, hidden[t].double()) for i in order[:k + 1]}
                    norm = float(sum(p[t, i] for i in sel)) if renorm else 1.0
                    w = {i: float(p[t, i]) / norm for i in sel + [nxt]}
                    H = sum(w[i] * f[i] for i in sel)
                    for j in range(num):
                        if j in sel:
                            scale = 1.0 / (1.0 - w[j] + w[nxt]) if renorm else 1.0 / (1.0 - float(p[t, j]))
                            Hm = sum((w[i] * scale * f[i] for i in sel if i != j), torch.zeros_like(H))
                            if promoted:
                                Hm = Hm + w[nxt] * scale * f[nxt]
                        else:
                            # renorm: S and the weights unchanged; no renorm: every weight / (1 - p_j)
                            Hm = H if renorm else H / (1.0 - float(p[t, j]))
                        acc[j] += float((H - Hm).pow(2).sum())
                total += acc / len(toks)
        out[layer.index] = total / samples
    return out


@pytest.mark.parametrize("family,overrides", [
    ("qwen3_moe", dict(norm_topk_prob=True)),
    ("qwen3_moe", dict(norm_topk_prob=False, num_experts_per_tok=3)),
    ("mixtral", {}),
    ("olmoe", dict(norm_topk_prob=False)),
])
def test_delta_h_follows_the_papers_closed_forms(tiny, family, overrides):
    """Independent of lightprune's routing code: the paper's w_i / (1 - w_j + w_(k+1)) (renormalised)
    and p_i / (1 - p_j) (not renormalised) weights, promoted expert silent or (promoted variant) run."""
    model = tiny(family, **overrides)
    batches = calibration_batches()
    stats, calls = collect_with_capture(model, batches, criteria=["delta_h", "delta_h_promoted"])
    # fp32 routing weights vs float64 ones; for unrouted tokens without renormalisation
    # w - w / (1 - p_j) cancels in fp32, relative error ~1e-7 / p_j on tiny terms
    for name, promoted in (("delta_h", False), ("delta_h_promoted", True)):
        expected = analytic_delta_h(model, batches, calls, promoted)
        for index, value in stats.raw(name).items():
            torch.testing.assert_close(value, expected[index], rtol=1e-4, atol=1e-8,
                                       msg=lambda m: f"{name} layer {index}: {m}")


def test_shared_expert_takes_no_part(tiny):
    """Changing the last MoE layer's shared expert changes nothing the experts see or are scored on."""
    model = tiny("qwen2_moe", norm_topk_prob=False)
    batches = calibration_batches()
    before = lp.collect_expert_stats(model, batches, criteria=ALL_CRITERIA, progress=False)
    last = find_moe_layers(model)[-1]
    with torch.no_grad():
        last.block.shared_expert.down_proj.weight.mul_(3.0)
        last.block.shared_expert_gate.weight.add_(1.0)
    after = lp.collect_expert_stats(model, batches, criteria=ALL_CRITERIA, progress=False)
    for name in ALL_CRITERIA:
        for index, value in before.raw(name).items():
            assert torch.equal(value, after.raw(name)[index]), (name, index)


# ----------------------------------------------------------------------------- padding
@pytest.mark.parametrize("family,overrides", [("qwen3_moe", {}), ("deepseek_v3", dict(
    n_routed_experts=64, n_group=8, topk_group=3, num_experts_per_tok=6))], ids=["qwen3_moe", "deepseek_v3-64"])
def test_non_finite_values_at_padding_positions_do_not_count(tiny, family, overrides):
    """Padding never counts, also when the model leaves NaN there (as some attention kernels do for
    fully masked rows): the padded positions' hidden states entering the last MoE layer are NaN (DeepSeek-V3:
    swaps and re-run pairs whose entering experts run on those NaN rows too)."""
    model = tiny(family, **overrides)
    batches = calibration_batches()
    clean = lp.collect_expert_stats(model, batches, criteria=ALL_CRITERIA, progress=False)
    last = find_moe_layers(model)[-1]
    masks = iter([b["attention_mask"].bool() for b in batches])

    def poison(module, args):
        hidden = args[0].clone()
        hidden[~next(masks)] = float("nan")
        return (hidden,) + tuple(args[1:])

    handle = last.block.register_forward_pre_hook(poison)
    try:
        poisoned = lp.collect_expert_stats(model, batches, criteria=ALL_CRITERIA, progress=False)
    finally:
        handle.remove()
    for name in ALL_CRITERIA:
        for index, value in clean.raw(name).items():
            # the NaN tokens are routed elsewhere than the clean padding was: the experts run on
            # differently sized token groups, so expert outputs move at fp32 rounding level
            torch.testing.assert_close(poisoned.raw(name)[index], value, **TOLERANCE[name],
                                       msg=lambda m: f"{name} layer {index}: {m}")


def test_a_subset_without_tokens_is_an_error(tiny):
    model = tiny("olmoe")
    empty = make_batch(2, 5, seed=0, pads={0: (5, 0), 1: (0, 5)})
    with pytest.raises(ValueError, match="no calibration tokens of subset 'all'"):
        lp.collect_expert_stats(model, [empty], progress=False)


# ----------------------------------------------------------------------------- errors and restoration
def hook_snapshot(model):
    """Every module's forward (pre-)hook ids, plus the global ones."""
    from torch.nn.modules import module as nn_module

    per_module = {name: (tuple(m._forward_hooks), tuple(m._forward_pre_hooks),
                         tuple(m._forward_hooks_with_kwargs), tuple(m._forward_pre_hooks_with_kwargs))
                  for name, m in model.named_modules()}
    return per_module, tuple(nn_module._global_forward_hooks), tuple(nn_module._global_forward_pre_hooks)


def implementations(model):
    return [(layer.index, layer.experts.config._experts_implementation) for layer in find_moe_layers(model)]


def test_vision_subsets_on_a_text_only_model_are_an_error(tiny):
    model = tiny("qwen3_moe")
    before = implementations(model)
    for subsets in (("all", "vision"), ("vision_low_attn",), ("text", "vision_high_attn")):
        with pytest.raises(ValueError, match="vision"):
            lp.collect_expert_stats(model, calibration_batches(), subsets=subsets, progress=False)
    assert implementations(model) == before


@pytest.mark.parametrize("batches", [[], iter([]), (b for b in [])], ids=["list", "iterator", "generator"])
def test_an_empty_calibration_set_is_an_error(tiny, batches):
    model = tiny("mixtral")
    before, hooks = implementations(model), hook_snapshot(model)
    with pytest.raises(ValueError, match="empty calibration set"):
        lp.collect_expert_stats(model, batches, progress=False)
    assert implementations(model) == before and hook_snapshot(model) == hooks


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_collection_leaves_the_model_exactly_as_it_was(tiny, family):
    model = tiny(family)
    batches = calibration_batches()
    before_logits = [logits_of(model, b) for b in batches]
    before_impl, before_hooks = implementations(model), hook_snapshot(model)
    before_config = model.config._experts_implementation
    assert before_impl and all(impl != "lightprune_observe" for _, impl in before_impl)
    lp.collect_expert_stats(model, batches, criteria=ALL_CRITERIA, progress=False)
    assert model.config._experts_implementation == before_config
    assert implementations(model) == before_impl
    assert hook_snapshot(model) == before_hooks
    for batch, logits in zip(batches, before_logits):
        assert torch.equal(logits_of(model, batch), logits)


def test_observed_forward_computes_the_models_output(tiny):
    """Inside the observer the model still computes its own function (the experts' weighted sum)."""
    model = tiny("olmoe")
    batches = calibration_batches()
    plain = [logits_of(model, b) for b in batches]
    with ExpertObserver(model, ("all",)) as observer, torch.no_grad():
        for batch, expected in zip(batches, plain):
            observer.begin_batch(batch)
            torch.testing.assert_close(model(**batch).logits, expected, rtol=1e-5, atol=1e-5)


def test_errors_inside_the_observer_restore_the_model(tiny):
    model = tiny("qwen3_moe")
    batch = calibration_batches()[0]
    before_impl, before_hooks = implementations(model), hook_snapshot(model)
    with pytest.raises(RuntimeError, match="begin_batch"):
        with ExpertObserver(model) as observer, torch.no_grad():
            assert all(impl == "lightprune_observe" for _, impl in implementations(model))
            model(**batch)
    assert implementations(model) == before_impl and hook_snapshot(model) == before_hooks
    half = {k: v[:1] for k, v in batch.items()}
    with pytest.raises(RuntimeError, match="whole batch"):
        with ExpertObserver(model) as observer, torch.no_grad():
            observer.begin_batch(batch)
            model(**half)
    assert implementations(model) == before_impl and hook_snapshot(model) == before_hooks
    with pytest.raises(RuntimeError, match="outside"):
        ExpertObserver(model).begin_batch(batch)


def test_nested_observers_are_refused_and_the_outer_one_keeps_working(tiny):
    model = tiny("qwen3_moe")
    batches = calibration_batches()
    before = implementations(model)
    outer = ExpertObserver(model, criteria=ALL_CRITERIA)
    with outer, torch.no_grad():
        with pytest.raises(RuntimeError, match="nested"):
            with ExpertObserver(model):
                pass
        assert all(impl == "lightprune_observe" for _, impl in implementations(model))
        for batch in batches:
            outer.begin_batch(batch)
            model(**batch)
    assert implementations(model) == before
    expected = lp.collect_expert_stats(model, batches, criteria=ALL_CRITERIA, progress=False)
    assert_stats_equal(outer.result(), expected, rtol=0)


def test_calibration_runs_the_output_head_on_one_position_only(tiny):
    """No criterion reads the logits: the head sees the last position (logits_to_keep=1), not [B, T, V]; the
    statistics equal those of a pass that computes every logit (test_nested_observers_... compares them)."""
    from lightprune.core.batch import head_skipped

    model = tiny("qwen3_moe")
    batches = calibration_batches()
    positions = []
    handle = model.get_output_embeddings().register_forward_pre_hook(lambda m, args: positions.append(args[0].shape))
    try:
        lp.collect_expert_stats(model, batches, progress=False)
    finally:
        handle.remove()
    assert [shape[:2] for shape in positions] == [(b["input_ids"].shape[0], 1) for b in batches]
    assert head_skipped(model) == {"logits_to_keep": 1}
    assert head_skipped(torch.nn.Linear(2, 2)) == {}  # a forward without the argument gets nothing it cannot take


# ----------------------------------------------------------------------------- state: resume and reduction
def observe(model, batches, state=None, criteria=ALL_CRITERIA):
    observer = ExpertObserver(model, ("all", "text"), criteria)
    if state is not None:
        observer.load_state_dict(state)
    with observer, torch.no_grad():
        for batch in batches:
            observer.begin_batch(batch)
            model(**batch)
    return observer


def assert_stats_equal(got, expected, rtol):
    assert got.criteria == expected.criteria and got.subsets == expected.subsets
    assert got.tokens == expected.tokens and got.samples == expected.samples
    assert got.metadata["batches"] == expected.metadata["batches"]
    for name in expected.criteria:
        for subset in expected.subsets:
            for index, value in expected.raw(name, subset).items():
                torch.testing.assert_close(got.raw(name, subset)[index], value, rtol=rtol, atol=0,
                                           msg=lambda m: f"{name}/{subset} layer {index}: {m}")


def more_batches():
    return calibration_batches() + [make_batch(2, 8, seed=11, pads={1: (2, 1)}), make_batch(2, 5, seed=12)]


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_resumed_calibration_equals_an_uninterrupted_one(tiny, family):
    model = tiny(family)
    batches = more_batches()
    whole = observe(model, batches).result()
    first = observe(model, batches[:2])
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)                # a checkpoint round trip
    buffer.seek(0)
    state = torch.load(buffer)
    resumed = observe(model, batches[2:], state=state)
    assert resumed.batches_seen == len(batches)
    assert_stats_equal(resumed.result(), whole, rtol=0)   # same additions in the same order


@pytest.mark.parametrize("family", ["mixtral", "deepseek_v3"])
def test_summed_states_of_disjoint_shards_equal_one_pass_over_the_union(tiny, family):
    """The DDP reduction at the functional level: all_reduce sums every accumulator."""
    model = tiny(family)
    batches = more_batches()
    whole = observe(model, batches).result()
    a, b = observe(model, batches[0::2]).state_dict(), observe(model, batches[1::2]).state_dict()
    summed = {"batches_seen": a["batches_seen"] + b["batches_seen"],
              "layers": {index: {name: a["layers"][index][name] + b["layers"][index][name]
                                 for name in a["layers"][index]} for index in a["layers"]}}
    reduced = ExpertObserver(model, ("all", "text"), ALL_CRITERIA)
    reduced.load_state_dict(summed)
    assert_stats_equal(reduced.result(), whole, rtol=1e-12)


def test_a_state_from_another_model_or_configuration_is_refused(tiny):
    model = tiny("qwen3_moe")
    state = observe(model, calibration_batches()[:1]).state_dict()
    with pytest.raises(ValueError, match="layers"):
        ExpertObserver(model, ("all", "text")).load_state_dict({"layers": {}})
    with pytest.raises(ValueError, match="shape"):
        ExpertObserver(model, ("all",)).load_state_dict(state)      # one subset, the state has two
    other = copy.deepcopy(state)
    del other["layers"][0]["delta_h"]
    with pytest.raises(ValueError, match="delta_h"):
        ExpertObserver(model, ("all", "text")).load_state_dict(other)


def test_sample_counts_do_not_depend_on_the_criteria_asked_for() -> None:
    """Samples with tokens of a subset are counted whether or not Delta-H is computed."""
    from lightprune.testing.batches import tiny_text_batch
    from lightprune.testing.tiny import tiny_model

    model = tiny_model("qwen3_moe")
    batches = [tiny_text_batch(model, batch_size=3, seed=s) for s in range(2)]
    full = lp.collect_expert_stats(model, batches, subsets=("all",), progress=False)
    reap_only = lp.collect_expert_stats(model, batches, subsets=("all",), criteria=("reap",), progress=False)
    assert reap_only.samples == full.samples == {"all": 6}
    assert reap_only.tokens == full.tokens


@pytest.mark.parametrize("scale", [0.5, 3.0, 12.0, 40.0], ids=["flat", "spread", "peaked", "saturated"])
def test_routing_kl_in_linear_time_equals_the_direct_double_sum(scale) -> None:
    """routing_kl's O(T E) form against KL(ps || qs_j) summed over every (j, i) pair in exact arithmetic (fractions of
    the float64 probabilities, 1 - p_j as the sum of the others): flat to saturated routers (p_j rounding to 1,
    most p_i below 1e-9), 64 experts; from float64 probabilities and from the float32 ones calibration uses."""
    from fractions import Fraction

    from lightprune.experts.criteria.routing_kl import KL_EPS, routing_kl

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(12, 64, generator=gen, dtype=torch.float64) * scale
    p = torch.softmax(logits, dim=-1)
    num = p.shape[1]
    eps = Fraction(KL_EPS)
    z = 1 + num * eps
    expected = torch.empty_like(p)
    for t in range(p.shape[0]):
        exact = [Fraction(float(v)) for v in p[t]]
        total = sum(exact)
        exact = [v / total for v in exact]                     # a distribution that sums to 1 exactly
        ps = [(v + eps) / z for v in exact]
        for j in range(num):
            rest = total_rest = sum(exact[:j] + exact[j + 1:])
            q = [Fraction(0) if i == j else exact[i] / total_rest for i in range(num)]
            assert rest > 0
            expected[t, j] = sum(float(a) * (math.log(a) - math.log((b + eps) / z)) for a, b in zip(ps, q))
    if scale >= 12.0:
        assert (p < 1e-9).any()
    if scale == 40.0:
        assert (p == 1.0).any()  # 1 - p_j rounds to 0: the sum of the others is used
    torch.testing.assert_close(routing_kl(p), expected, rtol=1e-9, atol=1e-15)  # atol: the reference's float sum
    torch.testing.assert_close(routing_kl(torch.softmax(logits.float(), dim=-1)).double(), expected,
                               rtol=2e-5, atol=1e-9)


class _Float64Sizes(torch.utils._python_dispatch.TorchDispatchMode):
    """The largest float64 tensor any op returns, with the op's name."""

    def __init__(self):
        super().__init__()
        self.largest = (0, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.numel() > self.largest[0]:
                self.largest = (t.numel(), func.__name__)
        return out


@pytest.mark.parametrize("family,overrides", [VARIANTS[2], VARIANTS[6], VARIANTS[8]])
def test_no_float64_tensor_over_tokens(tiny, family, overrides):
    """Per-token values are float32; only the accumulators [subsets, E] per layer are float64 (an accelerator's
    float64 is slow): during the whole pass no float64 tensor exceeds layers x subsets x E elements."""
    model = tiny(family, **overrides)
    batches = [make_batch(3, 24, seed=s) for s in range(2)]
    layers = find_moe_layers(model)
    bound = len(layers) * 2 * max(layer.num_experts for layer in layers)
    tokens = 3 * 24
    assert tokens > bound // layers[0].num_experts  # a [tokens, E] tensor would exceed the bound
    with _Float64Sizes() as probe:
        stats = lp.collect_expert_stats(model, batches, subsets=("all", "text"), criteria=ALL_CRITERIA,
                                        progress=False)
    assert 0 < probe.largest[0] <= bound, probe.largest
    assert stats.tokens["all"] == 2 * tokens

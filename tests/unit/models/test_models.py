"""Model adapters: which layers are MoE, what they hold, and the family's exact routing rule.

Expected values come from the transformers configs and modules themselves (the dense-layer rules
are re-stated here from transformers' decoder-layer constructors), and routing weights are
recomputed by hand in float64 from the router weights.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from fixtures import (
    ALL_SPARSE,
    ALWAYS_RENORMALISE,
    BIASED_SELECTION,
    BLOCK_BIAS,
    DEEPSEEK_LIKE,
    IDENTITY_EXPERTS,
    INPUT_SCALING,
    NEVER_RENORMALISE,
    NORMED_ROUTER_INPUT,
    ROUTER_ATTR,
    ROUTER_BIAS,
    ROW_BLOCK_EXPERTS,
    SHARED_EXPERTS,
    SPARSEMIXER,
    TOP_K_KEY,
    TOPK_THEN_SOFTMAX,
    block_of,
    call_router,
    cast_as_loaded,
    config_count,
    family_count_key,
    text_config_of,
)

import lightprune as lp
from lightprune.testing.tiny import TINY_FAMILIES

SOFTMAX_FAMILIES = tuple(f for f in TINY_FAMILIES
                         if f not in DEEPSEEK_LIKE | TOPK_THEN_SOFTMAX | BIASED_SELECTION | NORMED_ROUTER_INPUT
                         | set(BLOCK_BIAS) | set(ROUTER_BIAS) | SPARSEMIXER | INPUT_SCALING | IDENTITY_EXPERTS
                         | set(ROW_BLOCK_EXPERTS))
SHARED = SHARED_EXPERTS


def decoder_layers(model):
    """The language model's decoder layers, by transformers' attribute names: ``model.layers``,
    ``model.language_model.layers``, or ``language_model.model.layers`` (Llama 4 keeps its causal LM inside), or
    ``transformer.blocks`` (DBRX)."""
    if hasattr(model, "transformer"):
        return model.transformer.blocks
    if not hasattr(model, "model"):
        return model.language_model.model.layers
    inner = model.model
    return inner.language_model.layers if hasattr(inner, "language_model") else inner.layers


def expected_moe_indices(family: str, model) -> list[int]:
    """transformers' own rule for which decoder layers get a sparse MoE block, from the config."""
    cfg = text_config_of(model)
    n = cfg.num_layers if family == "longcat_flash" else cfg.num_hidden_layers  # LongCat: 2 attention sublayers
    # per decoder layer, num_hidden_layers counts them
    if family == "ernie4_5_moe":  # every moe_layer_interval-th layer from moe_layer_start_index to moe_layer_end_index
        return [i for i in range(n) if (i + 1) % cfg.moe_layer_interval == 0
                and cfg.moe_layer_start_index <= i <= cfg.moe_layer_end_index]
    if family in ("nemotron_h", "nemotron_h_omni"):  # one mixer per layer: the MoE ones
        return [i for i, kind in enumerate(cfg.layers_block_type) if kind == "moe"]
    if family == "kolibri1_1":  # dense in mlp_only_layers, sparse elsewhere (no decoder_sparse_step)
        return [i for i in range(n) if i not in cfg.mlp_only_layers]
    if family in ("llama4_text", "llama4"):  # Llama4TextDecoderLayer: sparse where layer_idx in moe_layers
        return [i for i in range(n) if i in cfg.moe_layers]
    if family in ("afmoe", "lfm2_moe"):  # dense below num_dense_layers
        return [i for i in range(n) if i >= cfg.num_dense_layers]
    if family == "jamba":  # transformers' own per-layer expert counts
        return [i for i, count in enumerate(cfg.layers_num_experts) if count > 1]
    if getattr(cfg, "mlp_layer_types", None) is not None:  # recent families build their layers from this list
        return [i for i in range(n) if cfg.mlp_layer_types[i] == "sparse"]
    if family in ALL_SPARSE:
        return list(range(n))
    if family in DEEPSEEK_LIKE:
        return [i for i in range(n) if i >= getattr(cfg, "first_k_dense_replace", 0)]
    # qwen2_moe, qwen3_moe, qwen3_vl_moe, internvl (qwen3_moe language model)
    return [i for i in range(n)
            if i not in cfg.mlp_only_layers and cfg.num_experts > 0 and (i + 1) % cfg.decoder_sparse_step == 0]


def renormalises(family: str, model) -> bool:
    """Whether the family's router renormalises the top-k probabilities (from transformers' routers)."""
    if family in ALWAYS_RENORMALISE:
        return True
    if family in NEVER_RENORMALISE:
        return False
    return bool(text_config_of(model).norm_topk_prob)


# ----------------------------------------------------------------------------- find_moe_layers
VARIANTS = [(f, {}) for f in TINY_FAMILIES] + [
    ("qwen3_moe", dict(num_hidden_layers=4, decoder_sparse_step=2, mlp_only_layers=[0])),
    ("qwen3_moe", dict(num_hidden_layers=4, mlp_only_layers=[1, 2])),
    ("qwen2_moe", dict(num_hidden_layers=4, decoder_sparse_step=2, mlp_only_layers=[3])),
    ("deepseek_v3", dict(first_k_dense_replace=0)),
    ("deepseek_v3", dict(first_k_dense_replace=2)),
    ("qwen3_vl_moe", dict(text_config=dict(num_hidden_layers=4, decoder_sparse_step=2))),
    ("internvl", dict(text_config=dict(num_hidden_layers=3, mlp_only_layers=[1]))),
]


@pytest.mark.parametrize("family,overrides", VARIANTS,
                         ids=[f"{f}-{'-'.join(f'{k}={v}' for k, v in o.items()) or 'default'}" for f, o in VARIANTS])
def test_find_moe_layers_follows_the_family_rule(tiny, family, overrides):
    model = tiny(family, **overrides)
    cfg = text_config_of(model)
    layers = lp.find_moe_layers(model)
    expected = expected_moe_indices(family, model)
    assert [layer.index for layer in layers] == expected
    if overrides:  # a variant must change the layout, or it tests nothing new
        assert expected != expected_moe_indices(family, tiny(family))

    decoder = decoder_layers(model)
    for index, decoder_layer in enumerate(decoder):
        # the rule agrees with the modules transformers actually built
        assert hasattr(block_of(decoder_layer, family), "experts") == (index in expected)
    count = config_count(cfg, family_count_key(family))
    for layer in layers:
        assert layer.block is block_of(decoder[layer.index], family)
        assert model.get_submodule(layer.name) is layer.block
        assert layer.router is getattr(layer.block, ROUTER_ATTR.get(family, "gate"))
        assert layer.experts is layer.block.experts
        zero = cfg.zero_expert_num if family in IDENTITY_EXPERTS else 0  # identity experts' rows after the experts'
        down = layer.experts.mlp.w2.shape[0] // config_count(cfg, ROW_BLOCK_EXPERTS[family]) \
            if family in ROW_BLOCK_EXPERTS else layer.experts.down_proj.shape[0]  # DBRX: I rows per expert
        assert layer.num_experts == count == down
        assert layer.router_linear.weight.shape[0] == count + zero and layer.identity_experts == zero
        top_k = 2 if family in SPARSEMIXER else config_count(cfg, TOP_K_KEY.get(family, "num_experts_per_tok"))
        assert layer.top_k == (top_k[layer.index] if isinstance(top_k, list) else top_k)  # a list: one per layer
        assert layer.has_shared_experts == (family in SHARED)
        if family in DEEPSEEK_LIKE:
            assert (layer.n_group, layer.topk_group) == (cfg.n_group, cfg.topk_group)
        else:
            assert (layer.n_group, layer.topk_group) == (1, 1)


def test_unsupported_model_types_list_the_supported_ones():
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    llama = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=32))
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=32, n_positions=16))
    for model, name in ((llama, "llama"), (gpt2, "gpt2")):
        with pytest.raises(ValueError) as err:
            lp.find_moe_layers(model)
        message = str(err.value)
        assert repr(name) in message
        for supported in TINY_FAMILIES:
            assert supported in message


@pytest.mark.parametrize("family,overrides", [
    ("qwen3_moe", dict(mlp_only_layers=[0, 1, 2])),
    ("qwen3_moe", dict(num_experts=0)),
    ("qwen2_moe", dict(decoder_sparse_step=4)),
    ("deepseek_v3", dict(first_k_dense_replace=3)),
    ("qwen3_vl_moe", dict(text_config=dict(mlp_only_layers=[0, 1]))),
], ids=["qwen3-mlp_only_all", "qwen3-zero_experts", "qwen2-step_beyond_depth", "deepseek-all_dense",
        "qwen3_vl-mlp_only_all"])
def test_dense_model_of_a_supported_family_has_no_moe_layers(tiny, family, overrides):
    model = tiny(family, **overrides)
    assert not any(hasattr(layer.mlp, "experts") for layer in decoder_layers(model))
    with pytest.raises(ValueError, match="no MoE layers"):
        lp.find_moe_layers(model)


def test_config_that_disagrees_with_the_modules_is_an_error(tiny):
    model = tiny("qwen3_moe")
    model.config.mlp_only_layers = [1]  # the module at layer 1 is still sparse
    with pytest.raises(ValueError, match="layer 1"):
        lp.find_moe_layers(model)


# ----------------------------------------------------------------------------- routing
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_route_equals_the_models_router_bitwise(tiny, family, dtype):
    model = cast_as_loaded(tiny(family), dtype)
    gen = torch.Generator().manual_seed(7)
    for layer in lp.find_moe_layers(model):
        hidden = torch.randn(13, layer.router_linear.weight.shape[1], generator=gen).to(dtype)
        with torch.no_grad():
            expected = call_router(family, layer, hidden)
            expected = (expected,) if isinstance(expected, torch.Tensor) else expected  # DBRX: the logits alone
            for mask in (None, torch.zeros(layer.num_experts, dtype=torch.bool)):
                got = layer.family.router_output(layer, layer.route(hidden, mask))  # as the router returns it
                got = (got,) if isinstance(got, torch.Tensor) else got
                for g, e in zip(got, expected, strict=True):
                    assert g.dtype == e.dtype and g.shape == e.shape
                    assert torch.equal(g, e)
            # calibration reads the router's first output as its logits where the family says it may
            logits = layer.family.router_logits(layer, hidden)
            returned = expected[0].reshape(logits.shape) if expected[0].numel() == logits.numel() else None
            same = returned is not None and torch.equal(returned, logits)
            assert same == layer.family.router_returns_logits, f"{family}: router_returns_logits is not {same}"



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_observed_router_equals_the_models_router_bitwise(tiny, family, dtype):
    """A family's observed router (the router's forward while calibration observes it) returns the router's own
    output bit for bit, also with saturated scores (ties) and a NaN row, and keeps its state only when it computed
    it; a router whose forward is already replaced on the instance keeps it."""
    model = cast_as_loaded(tiny(family), dtype)
    gen = torch.Generator().manual_seed(11)
    for layer in lp.find_moe_layers(model):
        kept = []
        forward = layer.family.observed_router(layer, kept.append)
        if forward is None:
            continue
        hidden = torch.randn(40, layer.router_linear.weight.shape[1], generator=gen)
        hidden[30:] *= 1e4                                   # saturated sigmoid scores: many equal selection scores
        with torch.no_grad():
            for h in (hidden.to(dtype), torch.cat([hidden[:3], torch.full_like(hidden[:1], float("nan"))]).to(dtype)):
                kept.clear()
                expected, got = call_router(family, layer, h), forward(h)
                for g, e in zip(got, expected, strict=True):
                    assert g.dtype == e.dtype and g.shape == e.shape
                    assert torch.equal(g, e) or (g.isnan().any() and torch.equal(g.nan_to_num(), e.nan_to_num()))
                assert len(kept) == (0 if h.isnan().any() else 1)
        layer.router.forward = layer.router.forward  # an instance forward (a device hook's, say) is left alone
        try:
            assert layer.family.observed_router(layer, kept.append) is None
        finally:
            del layer.router.forward

def _softmax_reference(hidden, weight, keep, top_k, renorm):
    """{original expert id: weight} per token, from the router with the masked rows deleted."""
    logits = hidden.double() @ weight.double()[keep].T
    out = []
    for row in logits:
        probs = torch.softmax(row, dim=0).tolist()
        top = sorted(range(len(keep)), key=lambda j: -probs[j])[:top_k]
        total = sum(probs[j] for j in top) if renorm else 1.0
        out.append({keep[j]: probs[j] / total for j in top})
    return out


SOFTMAX_VARIANTS = [(f, {}) for f in SOFTMAX_FAMILIES] + [
    ("qwen3_moe", dict(norm_topk_prob=False)),
    ("olmoe", dict(norm_topk_prob=True)),
    ("qwen2_moe", dict(norm_topk_prob=True, num_experts_per_tok=3)),
]


@pytest.mark.parametrize("family,overrides", SOFTMAX_VARIANTS,
                         ids=[f"{f}-{'-'.join(f'{k}={v}' for k, v in o.items()) or 'default'}"
                              for f, o in SOFTMAX_VARIANTS])
def test_masked_softmax_routing_matches_a_hand_computation(tiny, family, overrides):
    model = tiny(family, seed=3, **overrides)
    renorm = renormalises(family, model)
    gen = torch.Generator().manual_seed(11)
    for layer in lp.find_moe_layers(model):
        keep = sorted(torch.randperm(layer.num_experts, generator=gen)[:5].tolist())
        masked = torch.ones(layer.num_experts, dtype=torch.bool)
        masked[keep] = False
        hidden = torch.randn(24, layer.router_linear.weight.shape[1], generator=gen)
        with torch.no_grad():
            logits, weights, ids = layer.route(hidden, masked)
            plain_logits = layer.router(hidden)[0]
        assert weights.dtype == torch.float32
        assert torch.isneginf(logits[:, masked]).all()
        assert torch.equal(logits[:, ~masked], plain_logits[:, ~masked])
        assert not torch.isin(ids, torch.nonzero(masked).flatten()).any()
        reference = _softmax_reference(hidden, layer.router_linear.weight.detach(), keep, layer.top_k, renorm)
        for t, expected in enumerate(reference):
            got = dict(zip(ids[t].tolist(), weights[t].tolist()))
            assert set(got) == set(expected), f"token {t}"
            for e, w in expected.items():
                assert math.isclose(got[e], w, rel_tol=1e-5, abs_tol=1e-6), (t, e, got[e], w)
        if renorm:
            torch.testing.assert_close(weights.sum(-1), torch.ones(len(hidden)))
        else:
            assert (weights.sum(-1) < 1 - 1e-4).any()


def test_renormalisation_is_covered_both_ways(tiny):
    # guard for the test above: the tiny families exercise both softmax variants
    kinds = {renormalises(f, tiny(f)) for f in SOFTMAX_FAMILIES}
    assert kinds == {True, False}


@pytest.mark.parametrize("norm", [1.0, 2.0, None])
def test_masked_dbrx_routing_matches_a_hand_computation(tiny, norm):
    """DBRX by hand (float64) on the router with the masked rows deleted: softmax, the k largest, divided by their
    q-norm (``moe_normalize_expert_weights``; None: not normalised); an expert's output from its rows of
    ``w1`` / ``v1`` / ``w2``, checked against DbrxExperts."""
    model = tiny("dbrx", seed=3, ffn_config={"ffn_hidden_size": 16, "moe_num_experts": 8, "moe_top_k": 2,
                                             "moe_normalize_expert_weights": norm})
    rows = model.config.ffn_config.ffn_hidden_size
    gen = torch.Generator().manual_seed(11)
    for layer in lp.find_moe_layers(model):
        keep = sorted(torch.randperm(8, generator=gen)[:5].tolist())
        masked = torch.ones(8, dtype=torch.bool)
        masked[keep] = False
        hidden = torch.randn(24, 32, generator=gen)
        with torch.no_grad():
            _, weights, ids = layer.route(hidden, masked)
        p = torch.softmax(hidden.double() @ layer.router.layer.weight.detach().double()[keep].T, dim=-1)
        top = torch.topk(p, 2, dim=-1)
        chosen = top.values if norm is None else top.values / top.values.norm(p=norm, dim=-1, keepdim=True)
        for t in range(len(hidden)):
            expected = {keep[i]: float(w) for i, w in zip(top.indices[t].tolist(), chosen[t])}
            got = dict(zip(ids[t].tolist(), weights[t].tolist()))
            assert set(got) == set(expected), f"token {t}"
            for e, w in expected.items():
                assert math.isclose(got[e], w, rel_tol=1e-5, abs_tol=1e-6), (t, e, got[e], w)
        assert (layer.family.unselected_removal_is_free) == (norm is not None)
        mlp, x, e = layer.experts.mlp, hidden[:3].double(), 5  # expert 5: rows 5 I .. 6 I - 1
        w1, v1, w2 = (getattr(mlp, n).detach().double()[e * rows:(e + 1) * rows] for n in ("w1", "v1", "w2"))
        by_hand = (F.silu(x @ w1.T) * (x @ v1.T)) @ w2
        one = torch.full((3, 1), e)
        with torch.no_grad():
            module = layer.experts(hidden[:3], one, torch.ones(3, 1)).reshape(3, -1)
            ours = layer.family.selected_rows(layer, hidden[:3], torch.arange(3), one[:, 0], None)
        torch.testing.assert_close(module.double(), by_hand, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours.double(), by_hand, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", sorted(IDENTITY_EXPERTS))
def test_masked_routing_with_identity_experts_matches_a_hand_computation(tiny, family):
    """LongCat-Flash by hand (float64) on the router with the masked experts' rows deleted: softmax over the kept
    experts' and every zero-computation expert's rows, the k largest probabilities plus the correction bias chosen,
    their probabilities times ``routed_scaling_factor``; the masked experts get a large bias, which masking only the
    logits would let them win with. The zero-computation experts are chosen (ids past the routed experts')."""
    model = tiny(family, seed=3)
    cfg = text_config_of(model)
    gen = torch.Generator().manual_seed(11)
    chose_zero = False
    for layer in lp.find_moe_layers(model):
        num, zero = cfg.n_routed_experts, cfg.zero_expert_num
        weight, bias = layer.router.classifier.weight, layer.router.e_score_correction_bias
        assert (layer.num_experts, layer.identity_experts) == (num, zero) and weight.shape[0] == num + zero
        keep = sorted(torch.randperm(num, generator=gen)[:5].tolist())
        masked = torch.ones(num, dtype=torch.bool)
        masked[keep] = False
        with torch.no_grad():
            bias[:num][masked] = 5.0
            hidden = torch.randn(24, weight.shape[1], generator=gen)
            _, weights, ids = layer.route(hidden, masked)
        rows = keep + list(range(num, num + zero))
        p = torch.softmax(hidden.double() @ weight.detach().double()[rows].T, dim=-1)
        top = torch.topk(p + bias.double()[rows], layer.top_k, dim=-1).indices
        for t in range(len(hidden)):
            expected = {rows[i]: float(p[t, i]) * cfg.routed_scaling_factor for i in top[t].tolist()}
            got = dict(zip(ids[t].tolist(), weights[t].tolist()))
            assert set(got) == set(expected), f"token {t}"
            for e, w in expected.items():
                assert math.isclose(got[e], w, rel_tol=1e-5, abs_tol=1e-6), (t, e, got[e], w)
        chose_zero |= bool((ids >= num).any())
    assert chose_zero


#: (renormalisation epsilon or None for none, the router's scaling attribute or None) per block-bias family, from
#: each transformers router's forward
_BLOCK_BIAS_RULE = {"minimax_m2": (0.0, None), "hy_v3": (1e-20, "router_scaling_factor"),
                    "afmoe": (1e-20, "route_scale"), "lfm2_moe": (1e-6, "routed_scaling_factor"), "laguna": (0.0, None),
                    "minimax_m3_vl_text": (0.0, None), "minimax_m3_vl": (0.0, None), "step3p7": (0.0, None),
                    "inkling2_text": (1e-20, "routed_scaling_factor"), "inkling2": (1e-20, "routed_scaling_factor"),
                    "muse_spark": (1e-15, "routed_scaling_factor"),
                    "inkling2_loop_text": (1e-20, "routed_scaling_factor"),
                    "inkling2_loop": (1e-20, "routed_scaling_factor"), "ergo": (1e-20, "routed_scaling_factor")}


@pytest.mark.parametrize("family", sorted({*BLOCK_BIAS, *ROUTER_BIAS}))
def test_masked_biased_sigmoid_routing_matches_a_hand_computation(tiny, family):
    """Sigmoid scores (of soft-capped logits where the router caps them), top-k of the scores plus the block's or
    the router's bias, the k scores renormalised and scaled, by hand (float64) on the router with the masked rows
    deleted; the masked experts get a large bias, which masking only the logits would let them win with."""
    model = tiny(family, seed=3)
    eps, scale_attr = _BLOCK_BIAS_RULE[family]
    gen = torch.Generator().manual_seed(11)
    for layer in lp.find_moe_layers(model):
        bias = getattr(layer.block, BLOCK_BIAS[family]) if family in BLOCK_BIAS else \
            getattr(layer.router, ROUTER_BIAS[family])
        keep = sorted(torch.randperm(layer.num_experts, generator=gen)[:5].tolist())
        masked = torch.ones(layer.num_experts, dtype=torch.bool)
        masked[keep] = False
        with torch.no_grad():
            bias[masked] = 5.0
        hidden = torch.randn(24, layer.router_linear.weight.shape[1], generator=gen)
        with torch.no_grad():
            plain_ids = call_router(family, layer, hidden)[2]
            logits, weights, ids = layer.route(hidden, masked)
        assert torch.isin(plain_ids, torch.nonzero(masked).flatten()).any()  # the bias alone would pick them
        assert torch.isneginf(logits[:, masked]).all()
        scale = 1.0 if scale_attr is None else float(getattr(layer.router, scale_attr))
        logits = hidden.double() @ layer.router_linear.weight.detach().double()[keep].T
        logits = logits * float(getattr(layer.router, "output_multiplier", 1.0))  # Muse Spark scales its logits
        cap = float(getattr(layer.router, "router_logit_softcapping", 0.0))
        scores = torch.sigmoid(torch.tanh(logits / cap) * cap if cap > 0 else logits)
        for t, row in enumerate(scores.tolist()):
            top = sorted(range(len(keep)), key=lambda j: -(row[j] + float(bias[keep[j]])))[:layer.top_k]
            total = sum(row[j] for j in top) + eps
            expected = {keep[j]: row[j] / total * scale for j in top}
            got = dict(zip(ids[t].tolist(), weights[t].tolist()))
            assert set(got) == set(expected), f"token {t}"
            for e, w in expected.items():
                assert math.isclose(got[e], w, rel_tol=1e-5, abs_tol=1e-6), (t, e, got[e], w)


def _sparsemixer_reference(row: list[float], eps: float) -> dict[int, float]:
    """Sparsemixer in eval (arXiv 2409.12136) on one token's logits: the best expert weighted by a softmax over the
    experts within 2 eps (relative to max(|logit|, best)) of it; then the same for the best of the rest."""
    def pick(candidates: list[int]) -> tuple[int, float]:
        best = max(candidates, key=lambda j: row[j])
        near = [j for j in candidates if (row[best] - row[j]) / max(abs(row[j]), row[best]) <= 2 * eps]
        total = sum(math.exp(row[j] - row[best]) for j in near)
        return best, 1.0 / total

    everyone = list(range(len(row)))
    first, w1 = pick(everyone)
    second, w2 = pick([j for j in everyone if j != first])
    return {first: w1, second: w2}


@pytest.mark.parametrize("family", sorted(SPARSEMIXER))
def test_masked_sparsemixer_routing_matches_a_hand_computation(tiny, family):
    model = tiny(family, seed=3)
    gen = torch.Generator().manual_seed(11)
    thresholded = 0
    for layer in lp.find_moe_layers(model):
        eps = float(layer.router.router_jitter_noise)
        keep = sorted(torch.randperm(layer.num_experts, generator=gen)[:5].tolist())
        masked = torch.ones(layer.num_experts, dtype=torch.bool)
        masked[keep] = False
        hidden = torch.randn(24, layer.router_linear.weight.shape[1], generator=gen)
        with torch.no_grad():
            logits, weights, ids = layer.route(hidden, masked)
        assert torch.isneginf(logits[:, masked]).all()
        rows = (hidden.double() @ layer.router.weight.detach().double()[keep].T).tolist()
        for t, row in enumerate(rows):
            expected = {keep[j]: w for j, w in _sparsemixer_reference(row, eps).items()}
            got = dict(zip(ids[t].tolist(), weights[t].tolist()))
            assert set(got) == set(expected), f"token {t}"
            for e, w in expected.items():
                assert math.isclose(got[e], w, rel_tol=1e-5, abs_tol=1e-6), (t, e, got[e], w)
            thresholded += sum(w < 1 - 1e-6 for w in expected.values())
    assert thresholded > 0  # some softmaxes span more than one expert: the threshold is exercised


@pytest.mark.parametrize("family", sorted(INPUT_SCALING))
def test_masked_llama4_block_matches_a_hand_computation(tiny, family):
    """Llama 4: the masked block's output is the shared expert plus, for each of the k largest kept logits, the
    expert run on its input times sigmoid(logit) (float64 by hand from the weights); the router returns the dense
    scores (0 at every other expert) and the logits."""
    model = tiny(family, seed=3)
    gen = torch.Generator().manual_seed(11)
    for layer in lp.find_moe_layers(model):
        keep = sorted(torch.randperm(layer.num_experts, generator=gen)[:5].tolist())
        plan = lp.ExpertPlan(keep={l.index: (keep if l.index == layer.index else list(range(l.num_experts)))
                                   for l in lp.find_moe_layers(model)},
                             num_experts={l.index: l.num_experts for l in lp.find_moe_layers(model)})
        hidden = torch.randn(24, layer.router_linear.weight.shape[1], generator=gen)
        with torch.no_grad(), lp.mask_experts(model, plan):
            scores, logits = layer.router(hidden)
            out, _ = layer.block(hidden)
            shared = layer.block.shared_expert(hidden).double()
        experts = layer.experts
        gate_up, down = experts.gate_up_proj.detach().double(), experts.down_proj.detach().double()
        rows = hidden.double() @ layer.router.weight.detach().double()[keep].T
        for t in range(hidden.shape[0]):
            top = sorted(range(len(keep)), key=lambda j: -float(rows[t, j]))[:layer.top_k]
            want = shared[t].clone()
            for j in top:
                e, s = keep[j], torch.sigmoid(rows[t, j])
                assert math.isclose(float(scores[t, e]), float(s), rel_tol=1e-5)
                gate, up = (hidden[t].double() * s @ gate_up[e]).chunk(2)
                want += (torch.nn.functional.silu(gate) * up) @ down[e]
            assert int((scores[t] != 0).sum()) == layer.top_k
            torch.testing.assert_close(out[t].double(), want, rtol=1e-5, atol=1e-6)
        assert torch.isneginf(logits[:, [e for e in range(layer.num_experts) if e not in keep]]).all()


def test_calibration_of_a_masked_llama4_model_observes_the_kept_experts_only(tiny):
    """Llama 4 is observed in its block's own forward, behind the masked router: inside mask_experts every valid
    token counts top-k kept experts and none of the removed ones."""
    from fixtures import padded_batch

    model = tiny("llama4_text", seed=3)
    layers = lp.find_moe_layers(model)
    keep = [0, 2, 4, 6]
    plan = lp.ExpertPlan(keep={l.index: keep for l in layers}, num_experts={l.index: 8 for l in layers})
    batch = padded_batch()
    with lp.mask_experts(model, plan):
        stats = lp.collect_expert_stats(model, [batch], criteria=("frequency",), progress=False)
    tokens = int(batch["attention_mask"].sum())
    for layer in layers:
        counts = stats.raw("frequency", "all")[layer.index]
        assert float(counts.sum()) == tokens * layer.top_k
        assert float(counts[[e for e in range(8) if e not in keep]].abs().sum()) == 0.0
        assert float(counts[keep].min()) >= 0 and float(counts[keep].sum()) == tokens * layer.top_k
    assert not any("forward" in vars(layer.block) for layer in layers)


@pytest.mark.parametrize("family", sorted(NORMED_ROUTER_INPUT))
def test_masked_gemma4_routing_matches_a_hand_computation(tiny, family):
    """Gemma 4's router by hand (float64) on the router with the masked rows deleted: RMS norm without scale, times
    ``scale / sqrt(hidden)``, softmax over the kept experts, top-k, renormalised, times ``per_expert_scale``."""
    model = tiny(family, seed=3)
    gen = torch.Generator().manual_seed(11)
    for layer in lp.find_moe_layers(model):
        router = layer.router
        keep = sorted(torch.randperm(layer.num_experts, generator=gen)[:5].tolist())
        masked = torch.ones(layer.num_experts, dtype=torch.bool)
        masked[keep] = False
        hidden = torch.randn(24, router.hidden_size, generator=gen)
        with torch.no_grad():
            probabilities, weights, ids = layer.route(hidden, masked)
        assert (probabilities[:, masked] == 0).all()
        h = hidden.double()
        h = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + router.eps) * router.scale.double() / math.sqrt(h.shape[1])
        logits = h @ router.proj.weight.detach().double()[keep].T
        scale = router.per_expert_scale.detach().double()
        for t, row in enumerate(torch.softmax(logits, dim=-1).tolist()):
            top = sorted(range(len(keep)), key=lambda j: -row[j])[:layer.top_k]
            total = sum(row[j] for j in top)
            expected = {keep[j]: row[j] / total * float(scale[keep[j]]) for j in top}
            got = dict(zip(ids[t].tolist(), weights[t].tolist()))
            assert set(got) == set(expected), f"token {t}"
            for e, w in expected.items():
                assert math.isclose(got[e], w, rel_tol=1e-5, abs_tol=1e-6), (t, e, got[e], w)
    assert not torch.allclose(router.per_expert_scale, torch.ones_like(router.per_expert_scale))  # it matters


def _deepseek_reference(hidden, router, keep, n_group, topk_group, top_k):
    """DeepSeek-V3 routing by hand on the router with the masked rows deleted."""
    weight = router.weight.detach().double()[keep]
    bias = router.e_score_correction_bias.double()[keep].tolist()
    size = len(keep) // n_group
    out = []
    for row in torch.sigmoid(hidden.double() @ weight.T).tolist():
        choice = [s + b for s, b in zip(row, bias)]
        group_score = [sum(sorted(choice[g * size:(g + 1) * size], reverse=True)[:2]) for g in range(n_group)]
        groups = sorted(range(n_group), key=lambda g: -group_score[g])[:topk_group]
        candidates = [j for g in groups for j in range(g * size, (g + 1) * size)]
        top = sorted(candidates, key=lambda j: -choice[j])[:top_k]
        total = sum(row[j] for j in top) + 1e-20 if router.norm_topk_prob else 1.0
        out.append({keep[j]: row[j] / total * router.routed_scaling_factor for j in top})
    return out


@pytest.mark.parametrize("overrides,per_group", [
    ({}, 2),
    ({}, 3),
    (dict(n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=3), 2),
    (dict(n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=5, norm_topk_prob=False), 3),
], ids=["g2-keep2", "g2-keep3", "g4-keep2", "g4-keep3-nonorm"])
def test_masked_deepseek_routing_matches_a_hand_computation(tiny, overrides, per_group):
    model = tiny("deepseek_v3", seed=4, **overrides)
    gen = torch.Generator().manual_seed(5)
    for layer in lp.find_moe_layers(model):
        size = layer.num_experts // layer.n_group
        keep = sorted(g * size + int(i) for g in range(layer.n_group)
                      for i in torch.randperm(size, generator=gen)[:per_group])
        masked = torch.ones(layer.num_experts, dtype=torch.bool)
        masked[keep] = False
        # give the masked experts a large correction bias: masking only the logits would still select them
        with torch.no_grad():
            layer.router.e_score_correction_bias[masked] = 5.0
        hidden = torch.randn(24, layer.router.weight.shape[1], generator=gen)
        with torch.no_grad():
            plain_ids = layer.router(hidden)[2]
            logits, weights, ids = layer.route(hidden, masked)
        masked_ids = torch.nonzero(masked).flatten()
        assert torch.isin(plain_ids, masked_ids).any()  # the setup makes the check below able to fail
        assert not torch.isin(ids, masked_ids).any()
        assert torch.isneginf(logits[:, masked]).all()
        reference = _deepseek_reference(hidden, layer.router, keep, layer.n_group, layer.topk_group, layer.top_k)
        for t, expected in enumerate(reference):
            got = dict(zip(ids[t].tolist(), weights[t].tolist()))
            assert set(got) == set(expected), f"token {t}"
            for e, w in expected.items():
                assert math.isclose(got[e], w, rel_tol=1e-5, abs_tol=1e-6), (t, e, got[e], w)


def test_routing_limits_floor():
    from lightprune.models import RoutingLimits

    # ungrouped: the floor is top-k
    assert RoutingLimits(8, 3).min_experts == 3
    # grouped: every group keeps enough for its top-2 group score and for top-k over topk_group groups
    for num, top_k, n_group, topk_group in [(8, 2, 2, 1), (16, 3, 4, 2), (16, 5, 4, 2), (64, 8, 8, 4), (32, 1, 4, 4),
                                            (8, 1, 1, 1), (8, 3, 1, 1)]:
        limits = RoutingLimits(num, top_k, n_group, topk_group, grouped=True)
        per_group = limits.min_experts // n_group
        assert limits.min_experts % n_group == 0
        assert per_group >= 2 and per_group * topk_group >= top_k
        assert per_group == 2 or (per_group - 1) * topk_group < top_k  # the smallest such count

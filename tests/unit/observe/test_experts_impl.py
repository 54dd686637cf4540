"""expert_rows (the grouped matmul of the observing experts, and its one-call-per-expert form) against each
expert run alone (run_expert) row by row, for every tiny text family's experts module (gated or not, biased,
transposed); and the extra rows an observer asks for come back equal to the same experts run alone."""

from __future__ import annotations

import pytest
import torch
from fixtures import MULTIMODAL, ROW_BLOCK_EXPERTS, padded_batch

import lightprune as lp
from lightprune.observe import experts_impl
from lightprune.observe.experts_impl import expert_rows, observing_experts, run_expert
from lightprune.testing.tiny import TINY_FAMILIES

TEXT_FAMILIES = tuple(f for f in TINY_FAMILIES if f not in MULTIMODAL)


def _experts_input(model, layer) -> torch.Tensor:
    seen = []
    handle = layer.experts.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach()))
    try:
        with torch.no_grad():
            model(**padded_batch(seed=2, batch=2, seq=6, pad=0))
    finally:
        handle.remove()
    return seen[0].reshape(-1, seen[0].shape[-1])


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped_mm", "per_expert"])
@pytest.mark.parametrize("family", TEXT_FAMILIES)
def test_expert_rows_equal_each_expert_alone(tiny, family, grouped, monkeypatch) -> None:
    if grouped and experts_impl._GROUPED_MM is None:
        pytest.skip("this transformers has no grouped matmul")
    if not grouped:
        monkeypatch.setattr(experts_impl, "_GROUPED_MM", None)
    model = tiny(family, seed=1)
    layer = lp.find_moe_layers(model)[0]
    hidden = _experts_input(model, layer)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, hidden.shape[0], (40,), generator=gen)
    experts = torch.randint(0, layer.num_experts, (40,), generator=gen)
    experts[:3] = layer.num_experts - 1  # the last expert, several rows
    with torch.no_grad():
        if family in ROW_BLOCK_EXPERTS:  # DBRX: its family runs its experts' rows; each alone by DbrxExperts
            got = layer.family.selected_rows(layer, hidden, tokens, experts, expert_rows)
            expected = torch.cat([layer.experts(hidden[int(t)][None], e.reshape(1, 1), torch.ones(1, 1))[0]
                                  for t, e in zip(tokens, experts)])
        else:
            got = expert_rows(layer.experts, hidden, tokens, experts)
            expected = torch.stack([run_expert(layer.experts, int(e), hidden[int(t)][None])[0]
                                    for t, e in zip(tokens, experts)])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert expert_rows(layer.experts, hidden, tokens[:0], experts[:0]).shape == (0, hidden.shape[-1])


def test_extra_rows_come_back_with_the_routed_ones(tiny) -> None:
    model = tiny("qwen3_moe", seed=1)
    layers = lp.find_moe_layers(model)
    asked, seen = {}, {}

    def extra(layer, hidden, router_input, selected):
        rows = (torch.arange(hidden.shape[0]), (selected[:, 0] + 1) % layer.num_experts)
        asked[layer.index] = (hidden.clone(), *rows)
        return rows

    def observer(layer, hidden, router_input, selected, weights, outputs, extra_outputs):
        seen[layer.index] = extra_outputs

    batch = padded_batch(seed=3, batch=2, seq=5, pad=0)
    with torch.no_grad():
        plain = model(**batch).logits
        with observing_experts(layers, observer, extra=extra):
            observed = model(**batch).logits
    torch.testing.assert_close(observed, plain, rtol=1e-5, atol=1e-5)
    assert sorted(seen) == sorted(asked) == [layer.index for layer in layers]
    for layer in layers:
        hidden, tokens, experts = asked[layer.index]
        expected = torch.stack([run_expert(layer.experts, int(e), hidden[int(t)][None])[0]
                                for t, e in zip(tokens, experts)])
        torch.testing.assert_close(seen[layer.index], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ["deepseek_v3", "qwen3_moe", "gemma4_text"])
def test_router_logits_come_with_the_router_input_where_the_router_returns_them(tiny, family) -> None:
    """With router_logits=True both callbacks get the logits the router returned, equal to the family's logits of
    the router input; None where the router returns something else (Gemma 4: probabilities); the hooks go on exit."""
    model = tiny(family, seed=1)
    layers = lp.find_moe_layers(model)
    seen = {}

    def extra(layer, hidden, router_input, selected, router_logits, routing_state):
        seen[("extra", layer.index)] = router_logits
        return None

    def observer(layer, hidden, router_input, selected, weights, outputs, extra_outputs, router_logits, routing_state):
        seen[("observer", layer.index)] = (router_input, router_logits)

    with torch.no_grad(), observing_experts(layers, observer, extra=extra, router_logits=True):
        model(**padded_batch(seed=3, batch=2, seq=5, pad=0))
    for layer in layers:
        router_input, logits = seen[("observer", layer.index)]
        assert seen[("extra", layer.index)] is logits
        if layer.family.router_returns_logits:
            assert torch.equal(logits, layer.family.router_logits(layer, router_input))
        else:
            assert logits is None
        assert not layer.router._forward_hooks and not layer.router._forward_pre_hooks
        assert "forward" not in vars(layer.router)  # an observed router's forward (DeepSeek-V3) is gone too


def test_a_float64_model_is_observed_in_float64(tiny) -> None:
    """torch's grouped matmul has no float64 kernel: each expert runs alone, and the weighted sum stays in float64,
    so the observed forward gives the plain forward's logits to float64 rounding (not float32's)."""
    model = tiny("qwen3_moe", seed=1).to(torch.float64)
    layers = lp.find_moe_layers(model)
    seen = {}

    def observer(layer, hidden, router_input, selected, weights, outputs, extra_outputs):
        seen[layer.index] = (hidden.clone(), selected.clone(), outputs)

    batch = padded_batch(seed=3, batch=2, seq=5, pad=0)
    with torch.no_grad():
        plain = model(**batch).logits
        with observing_experts(layers, observer):
            observed = model(**batch).logits
    assert observed.dtype == plain.dtype == torch.float64
    torch.testing.assert_close(observed, plain, rtol=1e-12, atol=1e-12)
    for layer in layers:
        hidden, selected, outputs = seen[layer.index]
        expected = torch.stack([torch.stack([run_expert(layer.experts, int(e), hidden[t][None])[0] for e in row])
                                for t, row in enumerate(selected)])
        assert outputs.dtype == torch.float64
        torch.testing.assert_close(outputs, expected, rtol=1e-13, atol=1e-13)

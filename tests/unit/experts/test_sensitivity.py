"""Router sensitivity scores ("Router Sensitivity Under Lightweight Fine-Tuning Identifies Prunable Experts in
Mixture-of-Experts Models", arXiv 2608.07890, Eqs. 3-5) against independent computations.

Adapters are built with peft directly (LoRA ``target_parameters`` on the router weight, LoRA on
attention for a frozen router); expected values come from the router weights and the LoRA
factors themselves, and from hidden states captured by hooks of the test's own.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lightprune.experts.scores import ExpertScores
from lightprune.experts.sensitivity import (
    VacuousScoreError,
    effective_router_weights,
    innermost_router,
    logit_delta,
    router_logits,
    router_row_norms,
    weight_delta,
)
from lightprune.models import find_moe_layers

FAMILIES = ("mixtral", "qwen2_moe", "deepseek_v3")


def router_lora(model, r: int = 4, alpha: int = 8, seed: int = 1):
    """peft LoRA on every MoE router weight, with random (non-zero) B so the router moves."""
    from peft import LoraConfig, get_peft_model

    names = [f"{layer.name}.gate.weight" for layer in find_moe_layers(model)]
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, target_modules=[], target_parameters=names))
    return _random_lora_b(peft_model, seed)


def _random_lora_b(peft_model, seed: int):
    """LoRA B starts at zero (no change); random B makes the adapted weights differ from the base."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    return peft_model


def attention_lora(model, seed: int = 1):
    """peft LoRA on q_proj/v_proj only: the router stays frozen."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    return _random_lora_b(peft_model, seed)


def manual_norms(weight: torch.Tensor) -> torch.Tensor:
    w = weight.detach().double()
    return (w * w).sum(dim=1).sqrt()


def lora_merged_router(peft_model) -> dict[int, torch.Tensor]:
    """W0 + scaling * B @ A from the LoRA factors of each router (no peft merge helpers)."""
    out = {}
    for layer in find_moe_layers(peft_model.get_base_model()):
        wrapper = layer.router
        a = wrapper.lora_A["default"].weight.detach().double()
        b = wrapper.lora_B["default"].weight.detach().double()
        w0 = innermost_router(wrapper).weight.detach().double()
        out[layer.index] = w0 + wrapper.scaling["default"] * (b @ a)
    return out


def test_weight_delta_equals_independent_norm_change(tiny) -> None:
    model = tiny("mixtral")
    w0 = {layer.index: layer.router.weight.detach().clone() for layer in find_moe_layers(model)}
    before = router_row_norms(model)
    for layer, norms in before.items():
        torch.testing.assert_close(norms, manual_norms(w0[layer]), rtol=0, atol=1e-12)
    peft_model = router_lora(model)
    # the snapshot of a wrapped model is still the original router
    for layer, norms in router_row_norms(peft_model).items():
        assert torch.equal(norms, before[layer])
    merged = lora_merged_router(peft_model)
    after = effective_router_weights(peft_model)
    for layer in merged:
        torch.testing.assert_close(after[layer].double(), merged[layer], rtol=0, atol=1e-5)

    scores = weight_delta(before, after, model=peft_model)
    assert isinstance(scores, ExpertScores) and scores.criterion == "router_delta:weight"
    for layer, s in scores.items():
        expected = (manual_norms(merged[layer]) - manual_norms(w0[layer])).abs()
        torch.testing.assert_close(s, expected, rtol=0, atol=1e-5)
        assert s.dtype == torch.float64 and (s > 0).all()
        assert scores.limits[layer].num_experts == 8
    # norms or weights for "after" give the same scores
    as_norms = weight_delta(before, {l: manual_norms(w) for l, w in after.items()},
                            limits=ExpertScores.limits_of(find_moe_layers(model)))
    for layer in scores:
        torch.testing.assert_close(as_norms[layer], scores[layer], rtol=0, atol=1e-12)


def test_signed_weight_delta_keeps_the_sign(tiny) -> None:
    model = tiny("qwen2_moe")
    layers = find_moe_layers(model)
    before = {l.index: l.router.weight.detach().clone() for l in layers}
    after = {}
    for l in layers:
        scale = torch.linspace(0.5, 1.5, l.num_experts).unsqueeze(1)     # rows shrink and grow
        after[l.index] = before[l.index] * scale
    limits = ExpertScores.limits_of(layers)
    signed = weight_delta(before, after, signed=True, limits=limits)
    magnitude = weight_delta(before, after, limits=limits)
    assert signed.criterion == "router_delta:signed_weight"
    for l in layers:
        expected = manual_norms(after[l.index]) - manual_norms(before[l.index])
        torch.testing.assert_close(signed[l.index], expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(signed.raw[l.index], expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(magnitude[l.index], expected.abs(), rtol=0, atol=1e-12)
        assert (signed[l.index][:3] < 0).all() and (signed[l.index][-3:] > 0).all()


def test_vacuous_weight_delta_points_to_the_logit_delta(tiny) -> None:
    model = attention_lora(tiny("mixtral"))
    before = router_row_norms(model)
    with pytest.raises(VacuousScoreError, match="score='logit'"):
        weight_delta(before, effective_router_weights(model), model=model)
    # a router LoRA at its initialisation (B = 0) has not moved the router either
    from peft import LoraConfig, get_peft_model

    fresh = tiny("mixtral")
    untrained = get_peft_model(fresh, LoraConfig(r=2, target_modules=[], target_parameters=[
        f"{l.name}.gate.weight" for l in find_moe_layers(fresh)]))
    with pytest.raises(VacuousScoreError, match="logit"):
        weight_delta(router_row_norms(untrained), effective_router_weights(untrained), model=untrained)


def _block_inputs(model, batch) -> dict[int, torch.Tensor]:
    """Hidden states entering each MoE block, from pre-hooks of the test's own."""
    seen, handles = {}, []
    for layer in find_moe_layers(model.get_base_model() if hasattr(model, "get_base_model") else model):
        def pre(module, args, index=layer.index):
            seen[index] = args[0].detach().clone()
        handles.append(layer.block.register_forward_pre_hook(pre))
    try:
        with torch.no_grad():
            model.eval()
            model(**batch)
    finally:
        for h in handles:
            h.remove()
    return seen


def _batch(model, pad: int = 3) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 100, (2, 10), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, -pad:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.clone()}


@pytest.mark.parametrize("family", FAMILIES)
def test_router_logits_and_logit_delta_equal_recomputed_logits(tiny, family: str) -> None:
    base_model = tiny(family)
    w0 = {l.index: l.router.weight.detach().clone() for l in find_moe_layers(base_model)}
    batch = _batch(base_model)
    keep = batch["attention_mask"].reshape(-1).bool()
    n = int(keep.sum())
    h_base = _block_inputs(base_model, batch)
    l_base = router_logits(base_model, batch)
    peft_model = router_lora(base_model)
    merged = lora_merged_router(peft_model)
    h_adapt = _block_inputs(peft_model, batch)
    peft_model.train()
    l_adapt = router_logits(peft_model, batch)
    assert peft_model.training, "router_logits restores the training mode"
    assert not any(module._forward_hooks for module in peft_model.modules()), "hooks removed"

    expected = {}
    for layer in w0:
        hidden = h_base[layer].reshape(-1, w0[layer].shape[1])[keep]
        ref_base = F.linear(hidden.double(), w0[layer].double())
        hidden_a = h_adapt[layer].reshape(-1, w0[layer].shape[1])[keep]
        ref_adapt = F.linear(hidden_a.double(), merged[layer])
        assert l_base[layer].shape == (n, 8) and l_adapt[layer].shape == (n, 8)
        torch.testing.assert_close(l_base[layer].double(), ref_base, rtol=0, atol=1e-5)
        torch.testing.assert_close(l_adapt[layer].double(), ref_adapt, rtol=0, atol=1e-4)
        expected[layer] = ((ref_adapt - ref_base) ** 2).sum(dim=0).sqrt() / math.sqrt(n)

    plain = logit_delta(l_base, l_adapt)
    scores = logit_delta(l_base, l_adapt, model=peft_model)
    assert isinstance(scores, ExpertScores) and scores.criterion == "router_delta:logit"
    for layer in expected:
        torch.testing.assert_close(plain[layer], expected[layer], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(scores[layer], plain[layer], rtol=0, atol=0)


def test_logit_delta_for_a_frozen_router(tiny) -> None:
    """LoRA on attention only: the weight delta is vacuous, the logit delta is not."""
    model = tiny("mixtral")
    batch = _batch(model)
    base = router_logits(model, batch)
    adapted_model = attention_lora(model)
    adapted = router_logits(adapted_model, batch)
    with adapted_model.disable_adapter():
        off = router_logits(adapted_model, batch)
    for layer in base:
        torch.testing.assert_close(off[layer], base[layer], rtol=0, atol=0)
    scores = logit_delta(base, adapted, model=adapted_model)
    assert all((s > 0).all() for s in scores.values())
    with pytest.raises(VacuousScoreError, match="logit"):
        logit_delta(base, off)


def test_logit_delta_is_batch_size_normalised() -> None:
    base = {0: torch.zeros(4, 3)}
    adapted = {0: torch.tensor([[1.0, 0.0, 2.0]] * 4)}
    s4 = logit_delta(base, adapted)[0]
    s8 = logit_delta({0: torch.zeros(8, 3)}, {0: torch.tensor([[1.0, 0.0, 2.0]] * 8)})[0]
    torch.testing.assert_close(s4, torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64))
    torch.testing.assert_close(s8, s4)
    with pytest.raises(ValueError, match="same N"):
        logit_delta(base, {0: torch.zeros(5, 3)})

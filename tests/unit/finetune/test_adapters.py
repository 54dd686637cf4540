"""peft LoRA / IA3 and Houlsby adapters on tiny MoE models (router sensitivity ("Router Sensitivity Under Lightweight
Fine-Tuning Identifies Prunable Experts in Mixture-of-Experts Models", arXiv 2608.07890), section 3.3)."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightprune.finetune import AdapterSpec, apply_adapter, merged_router_weights, remove_adapters, router_is_trainable
from lightprune.finetune.houlsby import HoulsbyAdapter
from lightprune.finetune.moe_input_grad import moe_inputs_require_grad
from lightprune.models import find_moe_layers
from lightprune.models.unwrap import base_model_of
from lightprune.testing.tiny import tiny_model

ADAPTER_WORDS = ("lora_", "ia3_", "houlsby", "parametrizations")


def _batch(seed: int = 0, vocab: int = 100):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (2, 12), generator=g)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def _fit(model, ids, steps: int = 5, lr: float = 1e-2) -> list[float]:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _router_weights(model) -> dict[int, torch.Tensor]:
    out = {}
    for layer in find_moe_layers(model):
        router = layer.router_linear
        while hasattr(router, "base_layer"):
            router = router.base_layer
        weight = router.parametrizations.weight.original if hasattr(router, "parametrizations") else router.weight
        out[layer.index] = weight.detach().clone()
    return out


def _no_dropout(spec: AdapterSpec) -> AdapterSpec:
    spec.dropout = 0.0
    return spec


# ------------------------------------------------------------------------------------------ spec
@pytest.mark.parametrize("kwargs, word", [
    (dict(kind="lorra"), "lorra"), (dict(targets=["router", "mlp"]), "mlp"), (dict(r=0), "r must"),
    (dict(alpha=0), "alpha"), (dict(dropout=1.0), "dropout"), (dict(reduction=0), "reduction"),
    (dict(kind="lora", targets=[]), "at least one"),
])
def test_spec_validation_names_bad_value(kwargs, word):
    with pytest.raises(ValueError, match=word):
        AdapterSpec(**kwargs)


def test_spec_defaults_are_the_paper_reference():
    spec = AdapterSpec()
    assert (spec.kind, spec.targets, spec.r, spec.alpha, spec.dropout, spec.reduction) == \
        ("lora", ["router"], 8, 8, 0.1, 16)


# ------------------------------------------------------------------------------------------ LoRA router
@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "deepseek_v3", "gemma4_text"])
def test_lora_router_only_trains_router_rows(family):
    model = tiny_model(family)
    ids = _batch()
    ref_logits = _logits(model, ids)
    base_before = _router_weights(model)
    with pytest.warns(UserWarning, match="dropout"):
        peft_model = apply_adapter(model, AdapterSpec(kind="lora", targets=["router"], r=4, alpha=8, dropout=0.1))
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    names = {id(m): n for n, m in base_model_of(peft_model).named_modules()}
    routers = {names[id(layer.router_linear)] for layer in find_moe_layers(base_model_of(peft_model))}
    expected = {f"base_model.model.{r}.lora_{ab}.default.weight" for r in routers for ab in "AB"}
    assert trainable == expected
    assert router_is_trainable(peft_model)

    _fit(peft_model, ids, steps=3)
    merged = merged_router_weights(peft_model)
    base_after = _router_weights(base_model_of(peft_model))
    params = dict(peft_model.named_parameters())
    for index, weight in merged.items():
        assert torch.equal(base_after[index], base_before[index])  # base weights frozen
        name = next(r for r in routers if f".{index}." in r)
        a = params[f"base_model.model.{name}.lora_A.default.weight"].detach().double()
        b = params[f"base_model.model.{name}.lora_B.default.weight"].detach().double()
        independent = base_before[index].double() + (8 / 4) * b @ a
        torch.testing.assert_close(weight.double(), independent, rtol=1e-6, atol=1e-6)
        assert (weight - base_before[index]).norm(dim=1).gt(0).all()  # every row moved
    # the routing code of lightprune sees the adapted router
    layer = find_moe_layers(base_model_of(peft_model))[0]
    captured = {}
    handle = layer.router.register_forward_hook(lambda m, a, o: captured.update(x=a[0], out=o))
    logits_after = _logits(peft_model, ids)
    handle.remove()
    out = captured["out"][0] if isinstance(captured["out"], tuple) else captured["out"]
    torch.testing.assert_close(layer.route(captured["x"])[0].detach(), out)
    assert not torch.equal(logits_after, ref_logits)

    base = remove_adapters(peft_model)
    assert type(base).__name__ == type(model).__name__
    assert not [n for n, _ in base.named_parameters() if any(w in n for w in ADAPTER_WORDS)]
    assert not [n for n, _ in base.named_modules() if any(w in n for w in ADAPTER_WORDS)]
    assert torch.equal(_logits(base, ids), ref_logits)  # original weights, bitwise
    assert all(p.requires_grad for p in base.parameters())  # trainability restored


@pytest.mark.parametrize("family, target", [("qwen3_moe", "router"), ("mixtral", "router"), ("deepseek_v3", "router"),
                                            ("qwen3_moe", "experts")])
def test_moe_block_backward_hook_fires_after_the_adapter_gradients(tiny, family, target):
    """DeepSpeed ZeRO-3 reduces a leaf MoE block's gradients (a missing one as zero) in a full backward hook on the
    block. Below the first MoE block everything is frozen, so without a gradient on the block's input that hook
    fires as soon as the output gradient arrives, before the adapter factors inside the block have theirs."""
    def run(inputs_grad: bool):
        model = tiny(family)
        torch.manual_seed(0)  # peft draws LoRA A from the global generator
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = apply_adapter(model, AdapterSpec(targets=[target], r=4, alpha=4, dropout=0.0))
        moe_inputs_require_grad(model, enable=inputs_grad)
        first = find_moe_layers(base_model_of(model))[0]
        inside = [p for p in first.block.parameters() if p.requires_grad]
        seen = []
        first.block.register_full_backward_hook(lambda m, gin, gout: seen.append([p.grad is not None for p in inside]))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        ids = _batch(3)
        losses = []
        for _ in range(2):
            loss = model(input_ids=ids, labels=ids).loss
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "full backward hook is firing ... no inputs require gradients"
                loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return model, inside, seen, losses

    model, inside, seen, losses = run(True)
    trained = [p.detach().clone() for p in inside]
    assert inside and len(seen) == 2
    assert all(all(step) for step in seen)  # every factor inside the first block has its gradient at hook time
    _, inside_without, seen_without, losses_without = run(False)
    assert not any(any(step) for step in seen_without)  # what ZeRO-3 met: the hook ran before any of them
    assert losses == losses_without  # same values and gradients, bit for bit
    assert all(torch.equal(a, b) for a, b in zip(trained, inside_without, strict=True))
    base = remove_adapters(model)
    assert not any(m._forward_pre_hooks for m in base.modules())


def test_lora_targets_create_adapters_where_expected():
    def wrapped(spec):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            peft_model = apply_adapter(tiny_model("qwen3_moe"), _no_dropout(spec))
        return {n.split(".lora_A")[0].removeprefix("base_model.model.").replace(".base_layer", "")
                for n, _ in peft_model.named_parameters() if ".lora_A." in n}, peft_model

    names, _ = wrapped(AdapterSpec(targets=["attention"]))
    assert names and all(".self_attn." in n for n in names)
    assert {n.rsplit(".", 1)[1] for n in names} == {"q_proj", "k_proj", "v_proj", "o_proj"}

    names, peft_model = wrapped(AdapterSpec(targets=["experts"]))
    assert names == {f"model.layers.{i}.mlp.experts" for i in range(3)}
    # one wrapper per fused parameter, nested; find_moe_layers still walks the adapted model
    layers = find_moe_layers(base_model_of(peft_model))
    assert [layer.num_experts for layer in layers] == [8, 8, 8]
    params = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert sum(".experts.lora_A" in n for n in params) == 3 and sum(".experts.base_layer.lora_A" in n for n in params) == 3
    assert not router_is_trainable(peft_model)

    names, peft_model = wrapped(AdapterSpec(targets=["all_linear"]))
    assert any(n.endswith("mlp.gate") for n in names) and any(n.endswith("mlp.experts") for n in names)
    assert any(n.endswith("self_attn.q_proj") for n in names)
    assert not any("lm_head" in n for n in names)
    assert router_is_trainable(peft_model)


# ------------------------------------------------------------------------------------------ IA3, Houlsby
@pytest.mark.parametrize("kind", ["ia3", "houlsby"])
@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_frozen_router_adapters_fit_and_change_logits(kind, family):
    model = tiny_model(family)
    ids = _batch(1)
    ref_logits = _logits(model, ids)
    base_before = _router_weights(model)
    adapted = apply_adapter(model, AdapterSpec(kind=kind, reduction=4))
    assert torch.equal(_logits(adapted, ids), ref_logits)  # identity at init (scales = 1, Houlsby up = 0)
    assert not router_is_trainable(adapted)
    trainable = [n for n, p in adapted.named_parameters() if p.requires_grad]
    assert trainable and all(any(w in n for w in ADAPTER_WORDS) for n in trainable)
    assert not any(n.endswith("original") for n in trainable)

    losses = _fit(adapted, ids, steps=8, lr=3e-2)
    assert losses[-1] < losses[0]
    assert not torch.equal(_logits(adapted, ids), ref_logits)
    for index, weight in merged_router_weights(adapted).items():
        assert torch.equal(weight, base_before[index])
    for index, weight in _router_weights(base_model_of(adapted)).items():
        assert torch.equal(weight, base_before[index])

    base = remove_adapters(adapted)
    assert not [n for n, _ in base.named_parameters() if any(w in n for w in ADAPTER_WORDS)]
    assert not any(isinstance(m, HoulsbyAdapter) for m in base.modules())
    assert not any(m._forward_hooks for m in base.modules())
    assert torch.equal(_logits(base, ids), ref_logits)


def test_ia3_router_logits_are_scaled_input():
    model = apply_adapter(tiny_model("qwen3_moe"), AdapterSpec(kind="ia3"))
    layer = find_moe_layers(base_model_of(model))[0]
    scale = layer.router.parametrizations.weight[0].scale
    with torch.no_grad():
        scale.uniform_(0.5, 1.5)
    x = torch.randn(5, scale.shape[0])
    original = layer.router.parametrizations.weight.original
    torch.testing.assert_close(layer.family.router_logits(layer, x), (x * scale) @ original.T)


def test_houlsby_placement_and_shape():
    model = tiny_model("mixtral")
    adapted = apply_adapter(model, AdapterSpec(kind="houlsby"))
    assert adapted is model
    for layer in model.model.layers:
        assert isinstance(layer.houlsby_attn, HoulsbyAdapter) and isinstance(layer.houlsby_mlp, HoulsbyAdapter)
        assert layer.houlsby_attn.down.out_features == 32 // 16
        assert torch.count_nonzero(layer.houlsby_mlp.up.weight) == 0


def test_language_model_lora_with_a_trainable_projector():
    """The recovery of MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), appendix D.7:
    LoRA on every decoder Linear of the LM, projector in full, the rest frozen."""
    model = tiny_model("qwen3_vl_moe")
    decoder_linears = {n for n, m in model.named_modules()
                       if n.startswith("model.language_model.layers.") and isinstance(m, torch.nn.Linear)}
    peft_model = apply_adapter(model, AdapterSpec(kind="lora", targets=["language_model"], r=2, alpha=4,
                                                  dropout=0.0, trainable=["merger"]))
    wrapped = {n.removeprefix("base_model.model.").removesuffix(".lora_A.default")
               for n, _ in peft_model.named_modules() if n.endswith(".lora_A.default")}
    assert wrapped == decoder_linears and wrapped
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert all(".lora_" in n or ".visual.merger." in n for n in trainable)
    assert any(".visual.merger." in n for n in trainable)
    assert not any(".visual.blocks." in n or "embed_tokens" in n for n in trainable)
    base = remove_adapters(peft_model)
    assert not any(p.requires_grad is False for p in base.parameters())  # back to the fresh model's state


def test_unknown_trainable_module_is_named():
    with pytest.raises(ValueError, match="projector_xyz"):
        apply_adapter(tiny_model("qwen3_vl_moe"), AdapterSpec(kind="lora", targets=["language_model"],
                                                              trainable=["projector_xyz"]))

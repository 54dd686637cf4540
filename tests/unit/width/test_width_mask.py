"""mask_width (MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), section 3 and appendix
D.5) against independent computations: path attention with pruned keys removed before the softmax (explicit float64
attention in the model file's eager function), and FFN channels zeroed per modality (recomputed per layer from the
MLP's weights, also under a peft LoRA)."""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures.width import dense_lm, ffn_plan, lm_batch, random_keep, reference_logits

from lightprune.core.errors import PlanError
from lightprune.testing.batches import tiny_multimodal_batch
from lightprune.width.mask import mask_width
from lightprune.width.modality import token_modality
from lightprune.width.paths import MODALITIES, SYSTEM, TEXT, VISION
from lightprune.width.plan import WidthPlan


@pytest.fixture(scope="module")
def vl(tiny_cache):
    from lightprune.testing.tiny import tiny_model

    return tiny_model("qwen3_vl_moe")


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_path_masks_match_explicit_attention(vl, implementation, padding_side):
    model = copy.deepcopy(vl)
    model.config.text_config._attn_implementation_internal = implementation
    batch = tiny_multimodal_batch(model, batch_size=3, images_per_sample=2, padding_side=padding_side, seed=1)
    valid = batch["attention_mask"].bool()
    assert (~valid).any()
    dense = WidthPlan.dense(model)
    with torch.no_grad():
        plain = model(**batch).logits
        for columns in ([0], [1], [2], [0, 1, 2]):
            keep = random_keep(dense, columns, seed=sum(columns))
            with mask_width(model, dense.replace(attn_keep=keep)):
                assert model.config.text_config._attn_implementation == "lightprune_path:" + implementation
                assert model.config.vision_config._attn_implementation == "sdpa"
                got = model(**batch).logits
            expected = reference_logits(model, batch, keep)
            torch.testing.assert_close(got[valid], expected[valid], atol=2e-5, rtol=1e-5)
            assert (got[valid] - plain[valid]).abs().max() > 1e-3  # the masks change the output
        assert torch.equal(model(**batch).logits, plain)  # removal restores the model bitwise
        with mask_width(model, dense):
            torch.testing.assert_close(model(**batch).logits, plain, atol=1e-6, rtol=0)
        assert model.config.text_config._attn_implementation == implementation
        # on a text-only batch the vision paths have no pairs: masking them runs the masked attention
        # (every layer prunes some V2V and T2V heads) and must give the unmasked logits
        text = tiny_multimodal_batch(model, batch_size=3, images_per_sample=0, padding_side=padding_side, seed=2)
        text_valid = text["attention_mask"].bool()
        vision_only = dense.replace(attn_keep=random_keep(dense, [0, 1], seed=5))
        with mask_width(model, vision_only):
            got = model(**text).logits
        torch.testing.assert_close(got[text_valid], model(**text).logits[text_valid], atol=1e-6, rtol=0)


def test_unmasked_reference_is_the_model(vl):
    """The reference itself reproduces the model (so the comparison above tests the masks)."""
    batch = tiny_multimodal_batch(vl, batch_size=2, seed=3)
    valid = batch["attention_mask"].bool()
    with torch.no_grad():
        torch.testing.assert_close(reference_logits(vl, batch)[valid], vl(**batch).logits[valid], atol=2e-5, rtol=0)


def test_query_without_keys_outputs_zero():
    """A vision query whose every causal key is a pruned V2V key (no system prefix) gets a zero update."""
    model = dense_lm()
    ids = torch.tensor([[120, 120, 120, 5, 6, 7], [9, 120, 120, 5, 6, 7]])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    assert token_modality(ids, batch["attention_mask"], {120})[1, 0] == SYSTEM
    dense = WidthPlan.dense(model)
    keep = dense.attn_keep[0].clone()
    keep[:, 0] = False
    plan = dense.replace(attn_keep={0: keep})
    seen = {}
    hook = model.model.layers[0].self_attn.o_proj.register_forward_pre_hook(lambda m, a: seen.update(x=a[0]))
    with torch.no_grad(), mask_width(model, plan):
        got = model(**batch).logits
    hook.remove()
    per_head = seen["x"].view(2, 6, 4, 8)
    assert torch.equal(per_head[0, :3], torch.zeros(3, 4, 8))  # sample 0: vision queries lost every key
    assert per_head[1, 1:3].abs().amin(dim=-1).gt(0).any()  # sample 1: the system key remains
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, reference_logits(model, batch, {0: keep}, vision_ids={120}), atol=2e-5, rtol=0)


def _check_ffn(model, mlps, batch, ffn_keep, down):
    """Per layer: the masked MLP's output equals down(h * keep per token) recomputed from its input."""
    seen = {}
    handles = [mlp.register_forward_hook(lambda m, a, o, i=i: seen.update({i: (a[0], o)}))
               for i, mlp in enumerate(mlps)]
    plan = WidthPlan.dense(model).replace(ffn_keep=ffn_keep)
    try:
        with torch.no_grad(), mask_width(model, plan):
            model(**batch)
    finally:
        for h in handles:
            h.remove()
    modality = token_modality(batch["input_ids"], batch["attention_mask"], {120})
    for i, mlp in enumerate(mlps):
        x, out = seen[i]
        h = torch.nn.functional.silu(x @ mlp.gate_proj.weight.T) * (x @ mlp.up_proj.weight.T)
        factor = torch.ones_like(h)
        factor[modality == VISION] = ffn_keep[i]["vision"].float()
        factor[modality == TEXT] = ffn_keep[i]["text"].float()
        expected = down(i, h * factor)
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
        unmasked = down(i, h)
        assert (out - unmasked).abs().max() > 1e-4


def test_ffn_channels_masked_per_modality():
    model = dense_lm()
    batch = lm_batch()
    ffn_keep = ffn_plan(WidthPlan.dense(model))
    mlps = [layer.mlp for layer in model.model.layers]
    _check_ffn(model, mlps, batch, ffn_keep, lambda i, h: h @ mlps[i].down_proj.weight.T)
    plain = model(**batch).logits
    with torch.no_grad():
        h = mask_width(model, WidthPlan.dense(model).replace(ffn_keep=ffn_keep))
        assert not torch.equal(model(**batch).logits, plain)
        h.remove()
        assert torch.equal(model(**batch).logits, plain)


def test_ffn_masks_reach_a_lora_on_down_proj():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(dense_lm(), LoraConfig(r=4, lora_alpha=8, target_modules=["down_proj"], lora_dropout=0.0))
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    model.eval()
    layers = model.base_model.model.model.layers
    mlps = [layer.mlp for layer in layers]

    def down(i, h):
        d = mlps[i].down_proj
        a, b = d.lora_A["default"].weight, d.lora_B["default"].weight
        return h @ d.base_layer.weight.T + (h @ a.T @ b.T) * d.scaling["default"]

    _check_ffn(model, mlps, lm_batch(), ffn_plan(WidthPlan.dense(model), seed=1), down)


def test_masks_carry_gradients_and_generation_appends_text():
    model = dense_lm()
    batch = lm_batch()
    dense = WidthPlan.dense(model)
    plan = dense.replace(attn_keep=random_keep(dense, [0, 1, 2]), ffn_keep=ffn_plan(dense))
    with mask_width(model, plan):
        model(**batch).logits.logsumexp(-1).sum().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    # greedy generation with a KV cache equals re-running the full sequence under the same masks
    prompt = {"input_ids": batch["input_ids"][:1, :8], "attention_mask": batch["attention_mask"][:1, :8]}
    with torch.no_grad(), mask_width(model, plan):
        generated = model.generate(**prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
        ids = prompt["input_ids"]
        for _ in range(4):
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
            ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
    assert (ids[:, 8:] != 120).all()  # a generated vision id would be TEXT in generation only
    assert torch.equal(generated, ids)


def test_errors_and_nesting(vl):
    model = copy.deepcopy(vl)
    dense = WidthPlan.dense(model)
    bad = WidthPlan({}, {1: {mu: torch.ones(24, dtype=torch.bool) for mu in MODALITIES}}, dense.num_heads, {1: 24})
    with pytest.raises(PlanError, match="FFN channels of layer 1, an MoE layer"):
        mask_width(model, bad)
    with pytest.raises(PlanError, match="layer 0 expects 8 attention heads, the model has 4"):
        mask_width(model, WidthPlan({}, {}, {0: 8, 1: 4}, {}))
    with pytest.raises(TypeError, match="WidthPlan"):
        mask_width(model, {"attn_keep": {}})
    batch = tiny_multimodal_batch(model, seed=2)
    with mask_width(model, dense):
        with pytest.raises(RuntimeError, match="already active"):
            mask_width(model, dense)
        embeds = model.get_input_embeddings()(batch["input_ids"])
        with pytest.raises(ValueError, match="inputs_embeds only"):
            model(inputs_embeds=embeds, attention_mask=batch["attention_mask"])
    eager_vision = copy.deepcopy(vl)
    eager_vision.config.text_config._attn_implementation_internal = "flex_attention"
    with pytest.raises(ValueError, match=r"wraps attention implementation \['sdpa', 'eager'\].*'flex_attention'"):
        mask_width(eager_vision, dense)
    assert eager_vision.config.text_config._attn_implementation == "flex_attention"
    # nothing left behind: a new mask installs fine
    mask_width(model, dense).remove()


def ffn_keep_hook(modality, keep):
    """Reference FFN mask: multiply down_proj's input by keep["vision"] / keep["text"] on those tokens."""
    def hook(module, args):
        h = args[0]
        factor = torch.ones_like(h)
        factor[modality == VISION] = keep["vision"].float()
        factor[modality == TEXT] = keep["text"].float()
        return (h * factor,)
    return hook


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava_onevision"])
def test_dense_mllm_paths_and_ffn_match_reference(family):
    from lightprune.testing.tiny import tiny_model

    model = tiny_model(family)
    batch = tiny_multimodal_batch(model, batch_size=3, images_per_sample=1, padding_side="left", seed=1)
    valid = batch["attention_mask"].bool()
    dense = WidthPlan.dense(model)
    assert dense.intermediate_size == {0: 24, 1: 24}
    keep, ffn_keep = random_keep(dense, [0, 1, 2], seed=2), ffn_plan(dense, seed=2)
    modality = token_modality(batch["input_ids"], batch["attention_mask"], {120, 121})
    with torch.no_grad():
        plain = model(**batch).logits
        with mask_width(model, dense.replace(attn_keep=keep, ffn_keep=ffn_keep)):
            assert model.config.vision_config._attn_implementation == "sdpa"
            got = model(**batch).logits
        hooks = {l: ffn_keep_hook(modality, ffn_keep[l]) for l in ffn_keep}
        expected = reference_logits(model, batch, keep, ffn_hooks=hooks)
        assert torch.equal(model(**batch).logits, plain)
    torch.testing.assert_close(got[valid], expected[valid], atol=2e-5, rtol=1e-5)
    assert (got[valid] - plain[valid]).abs().max() > 1e-3

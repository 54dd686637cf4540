"""Vision subsets of collect_expert_stats on tiny MLLMs, against eager attention probabilities."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import lightprune as lp
from lightprune.models import get_family
from lightprune.testing.batches import tiny_multimodal_batch, tiny_text_batch
from lightprune.testing.tiny import tiny_model

Q = 0.25


def _expected_low_high(model, batch, layer_index: int):
    """Bottom / top ceil(q n) vision tokens per sample by eager text->vision attention (over the text queries that
    may attend to the token: causal, within a sliding window), ties by position."""
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = eager(**batch, output_attentions=True).attentions[layer_index]   # [B, heads, S, S]
    ids = batch["input_ids"]
    valid = batch["attention_mask"].bool()
    vision = torch.isin(ids, torch.tensor(get_family(model).vision_token_ids())) & valid
    text = valid & ~vision
    cfg = model.config.text_config
    sliding = (getattr(cfg, "layer_types", None) or ["full_attention"] * (layer_index + 1))[layer_index]
    window = cfg.sliding_window if sliding == "sliding_attention" else None  # Gemma 4's local layers
    low = torch.zeros_like(vision)
    high = torch.zeros_like(vision)
    for b in range(ids.shape[0]):
        scores = {}
        for v in vision[b].nonzero().flatten().tolist():
            queries = [q for q in text[b].nonzero().flatten().tolist() if q >= v and (window is None or q - v < window)]
            if queries:
                scores[v] = float(attentions[b, :, queries, v].double().mean())
        n = max(1, math.ceil(Q * len(scores)))
        ranked = sorted(scores, key=lambda v: (scores[v], v))
        low[b, ranked[:n]] = True
        ranked_high = sorted(scores, key=lambda v: (-scores[v], v))
        high[b, ranked_high[:n]] = True
    return low, high, vision, text


def _routing(model, batch):
    """Selected experts per MoE layer [B*S, k], captured from the model's own routers."""
    captured = {}
    handles = [l.router.register_forward_hook(lambda m, a, out, i=l.index: captured.__setitem__(i, out[2]))
               for l in lp.find_moe_layers(model)]
    try:
        with torch.no_grad():
            model(**batch)
    finally:
        for h in handles:
            h.remove()
    return captured


@pytest.mark.parametrize("family", ["qwen3_vl_moe", "internvl", "gemma4", "qwen3_omni_moe_thinker", "glm4v_moe",
                                    "deepseek_ocr2", "unlimited_ocr", "aria"])
def test_vision_subsets_follow_eager_attention(family: str) -> None:
    model = tiny_model(family)
    batch = tiny_multimodal_batch(model, seed=3)
    subsets = ("all", "text", "vision", "vision_low_attn", "vision_high_attn")
    stats = lp.collect_expert_stats(model, [batch], subsets=subsets, low_attn_quantile=Q, progress=False)
    routing = _routing(model, batch)
    for layer in lp.find_moe_layers(model):
        low, high, vision, text = _expected_low_high(model, batch, layer.index)
        selected = routing[layer.index]
        for subset, mask in (("text", text), ("vision", vision), ("vision_low_attn", low), ("vision_high_attn", high)):
            expected = torch.bincount(selected[mask.flatten()].flatten(), minlength=layer.num_experts).double()
            torch.testing.assert_close(stats.raw("frequency", subset)[layer.index], expected, rtol=0, atol=0)
        assert low.sum() > 0 and not torch.equal(low, high)


@pytest.mark.parametrize("family", ["hy_v4_vl", "dots3_note", "minimax_m3_vl", "mistral_large4"])
def test_attention_subsets_are_refused_where_the_probe_would_change_the_attention(family: str) -> None:
    """Hy4-VL's and dots3-note's DeepSeek sparse attention and MiniMax-M3's block-sparse attention build their indexer's
    mask only when the implementation is named "eager" or "sdpa": under the probe's renamed implementation they would
    attend to every key (other outputs, other routing). The attention subsets are refused by name; the others run."""
    model = tiny_model(family)
    batch = tiny_multimodal_batch(model, seed=3)
    with torch.no_grad():
        reference = model(**batch).logits
    with pytest.raises(ValueError, match=r"builds its attention mask from the implementation's name .*"
                                         r"vision_low_attn, vision_high_attn"):
        lp.collect_expert_stats(model, [batch], subsets=("all", "vision_low_attn"), progress=False)
    stats = lp.collect_expert_stats(model, [batch], subsets=("all",), progress=False)  # no probe: runs
    routing, kept = _routing(model, batch), batch["attention_mask"].flatten().bool()
    for layer in lp.find_moe_layers(model):
        expected = torch.bincount(routing[layer.index][kept].flatten(), minlength=layer.num_experts).double()
        assert torch.equal(stats.raw("frequency", "all")[layer.index], expected), layer.index
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, reference)  # nothing left switched


def test_vision_subset_without_vision_tokens_is_an_error() -> None:
    model = tiny_model("qwen3_vl_moe")
    batch = tiny_multimodal_batch(model, images_per_sample=0, seed=1)
    with pytest.raises(ValueError, match="no calibration tokens of subset 'vision'"):
        lp.collect_expert_stats(model, [batch], subsets=("all", "vision"), progress=False)
    text_model = tiny_model("qwen3_moe")
    with pytest.raises(ValueError, match="need vision tokens"):
        lp.collect_expert_stats(text_model, [tiny_text_batch(text_model)], subsets=("vision",), progress=False)


def test_observation_restores_the_mllm_exactly() -> None:
    model = tiny_model("qwen3_vl_moe")
    batch = tiny_multimodal_batch(model, seed=5)
    text_cfg = model.config.text_config
    before = (text_cfg._attn_implementation, text_cfg._experts_implementation)
    with torch.no_grad():
        reference = model(**batch).logits
    lp.collect_expert_stats(model, [batch], subsets=("vision_low_attn",), progress=False)
    assert (text_cfg._attn_implementation, text_cfg._experts_implementation) == before
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, reference)


@pytest.mark.parametrize("family", ["qwen3_5_moe", "qwen4_exp", "glm5_next"])
def test_a_hybrid_mllm_has_modality_subsets_and_refuses_attention_ones(family) -> None:
    """Qwen3.5-MoE and Qwen4-exp: a linear-attention (gated delta net) layer, then a full or indexed one. Text /
    vision frequencies are the routers' own counts over those tokens; an attention subset is an error naming the
    linear layer."""
    model = tiny_model(family)
    batch = tiny_multimodal_batch(model, seed=3)
    stats = lp.collect_expert_stats(model, [batch], subsets=("all", "text", "vision"), progress=False)
    routing = _routing(model, batch)
    ids, valid = batch["input_ids"], batch["attention_mask"].bool()
    vision = torch.isin(ids, torch.tensor(get_family(model).vision_token_ids())) & valid
    assert vision.any() and (valid & ~vision).any()
    for layer in lp.find_moe_layers(model):
        for subset, mask in (("text", valid & ~vision), ("vision", vision)):
            expected = torch.bincount(routing[layer.index][mask.flatten()].flatten(), minlength=layer.num_experts)
            torch.testing.assert_close(stats.raw("frequency", subset)[layer.index], expected.double(), rtol=0, atol=0)
    with pytest.raises(ValueError, match="decoder layer 0 \\(a 'linear_attention' layer\\) has no softmax"):
        lp.collect_expert_stats(model, [batch], subsets=("vision_low_attn",), progress=False)

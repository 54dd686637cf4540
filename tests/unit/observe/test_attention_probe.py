"""AttentionProbe against eager ``output_attentions``; tiny batches; low/high masks; clean exit."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from lightprune.models import get_family
from lightprune.observe import PROBE_PREFIX, AttentionProbe, low_high_masks, modality_masks
from lightprune.testing.batches import special_token_ids, tiny_multimodal_batch, tiny_text_batch

MLLMS = ("qwen3_vl_moe", "internvl", "gemma4", "qwen3_omni_moe_thinker", "glm4v_moe")


def _masks(model, batch):
    return modality_masks(batch["input_ids"], batch["attention_mask"], get_family(model).vision_token_ids())


def _expected(attentions, text, attention_mask, window=None):
    """Mean over heads and allowed text queries of the eager attention probabilities, per key."""
    seq = attentions.shape[-1]
    q_pos, k_pos = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    allowed = k_pos <= q_pos
    if window:
        allowed = allowed & (q_pos - k_pos < window)
    allowed = allowed[None] & text[:, :, None] & attention_mask.bool()[:, None, :]  # [B, q, k]
    total = (attentions.double() * allowed[:, None]).sum(dim=(1, 2))
    count = allowed.sum(dim=1).double() * attentions.shape[1]
    return total / count, count > 0


def _state(model):
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._forward_hooks_with_kwargs)
                for m in model.modules())
    return ({i: c.__dict__.get("_attn_implementation_internal") for i, c in configs.items()},
            dict(AttentionInterface._global_mapping), dict(AttentionMaskInterface._global_mapping), hooks,
            {k for m in model.modules() for k in vars(m) if "probe" in k.lower()})


def _layer_window(model, layer: int) -> int | None:
    """The sliding window of a decoder layer that the config marks ``sliding_attention`` (Gemma 4's local layers)."""
    cfg = getattr(model.config, "text_config", None) or model.config
    types = getattr(cfg, "layer_types", None)
    return cfg.sliding_window if types and types[layer] == "sliding_attention" else None


def _check_probe(model, batch, layers, window=None, eager_model=None):
    text, vision = _masks(model, batch)
    with torch.no_grad():
        plain = model(**batch).logits
        with AttentionProbe(model, layers) as probe:
            probe.set_batch(text, vision)
            probed = model(**batch).logits
            scores = probe.pop_scores()
        eager = eager_model or copy.deepcopy(model)
        eager.set_attn_implementation("eager")
        attentions = eager(**batch, output_attentions=True).attentions
    torch.testing.assert_close(probed, plain, atol=1e-6, rtol=0)
    assert sorted(scores) == sorted(layers)
    for layer in layers:
        expected, attended = _expected(attentions[layer], text, batch["attention_mask"],
                                       window or _layer_window(model, layer))
        got = scores[layer]
        assert got.dtype == torch.float32 and got.shape == text.shape
        finite = vision & attended
        assert torch.isnan(got[~finite]).all()
        torch.testing.assert_close(got[finite].double(), expected[finite], atol=1e-6, rtol=1e-5)
    return scores, text, vision


@pytest.mark.parametrize("family", MLLMS)
@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_probe_matches_eager_attentions(tiny, family, padding_side):
    model = tiny(family)
    batch = tiny_multimodal_batch(model, batch_size=3, images_per_sample=2, padding_side=padding_side, seed=1)
    assert (batch["attention_mask"] == 0).any()
    scores, text, vision = _check_probe(model, batch, layers=[0, 1])
    # text follows every image (in a full-attention layer: a sliding window may not reach back to it)
    assert all(torch.isfinite(s[vision]).all() for layer, s in scores.items() if _layer_window(model, layer) is None)


@pytest.mark.parametrize("family", MLLMS)
def test_probe_without_padding_uses_the_causal_path(tiny, family):
    # InternVL: equal lengths, so sdpa gets no mask (is_causal); Qwen3-VL: one sample
    model = tiny(family)
    batch = tiny_multimodal_batch(model, batch_size=2 if family == "internvl" else 1, pad_last=0)
    assert (batch["attention_mask"] == 1).all()
    _check_probe(model, batch, layers=[1])


def test_probe_sliding_window_and_eager_original(tiny):
    model = tiny("internvl", text_config={"use_sliding_window": True, "sliding_window": 5})
    batch = tiny_multimodal_batch(model, batch_size=2, images_per_sample=2, text_tokens=(3, 6))
    _check_probe(model, batch, layers=[0, 1], window=5)
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    _check_probe(eager, batch, layers=[0, 1], window=5, eager_model=copy.deepcopy(eager))


def test_probe_on_a_text_model_with_a_marked_subset(tiny):
    # any positions can be "vision": GQA (4 heads over 2 kv heads), right padding, all layers by default
    model = tiny("qwen3_moe")
    batch = tiny_text_batch(model, batch_size=3, seq_len=10, seed=2)
    vision = torch.zeros_like(batch["attention_mask"], dtype=torch.bool)
    vision[:, 2:5] = True
    valid = batch["attention_mask"].bool()
    text = valid & ~vision
    with torch.no_grad(), AttentionProbe(model) as probe:
        assert probe.layers == [0, 1, 2]
        probe.set_batch(text, vision & valid)
        model(**batch)
        scores = probe.pop_scores()
        eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = eager(**batch, output_attentions=True).attentions
    for layer in range(3):
        expected, _ = _expected(attentions[layer], text, batch["attention_mask"])
        torch.testing.assert_close(scores[layer][vision].double(), expected[vision], atol=1e-6, rtol=1e-5)
        assert torch.isnan(scores[layer][~vision]).all()


def test_layer_scores_are_readable_inside_the_forward(tiny):
    # the MoE block of layer l runs after layer l's attention: its scores are there already
    model = tiny("qwen3_vl_moe")
    batch = tiny_multimodal_batch(model, batch_size=2)
    text, vision = _masks(model, batch)
    _, decoder = get_family(model).decoder_layers()
    seen = {}
    with AttentionProbe(model, layers=[0, 1]) as probe, torch.no_grad():
        def read(module, args, i):
            seen[i] = probe.layer_scores(i).clone()

        handles = [decoder[i].mlp.register_forward_pre_hook(lambda m, a, i=i: read(m, a, i)) for i in (0, 1)]
        try:
            probe.set_batch(text, vision)
            with pytest.raises(RuntimeError, match="no scores for layer 0"):
                probe.layer_scores(0)
            model(**batch)
        finally:
            for handle in handles:
                handle.remove()
        scores = probe.pop_scores()
        with pytest.raises(RuntimeError, match="no scores"):
            probe.pop_scores()
    for i in (0, 1):
        torch.testing.assert_close(seen[i], scores[i], equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize("family", MLLMS)
def test_text_only_batch_gives_nan(tiny, family):
    model = tiny(family)
    batch = tiny_multimodal_batch(model, images_per_sample=0)
    assert "pixel_values" not in batch
    text, vision = _masks(model, batch)
    assert not vision.any()
    with torch.no_grad(), AttentionProbe(model) as probe:
        probe.set_batch(text, vision)
        model(**batch)
        scores = probe.pop_scores()
    assert sorted(scores) == [layer.index for layer in get_family(model).layers()]
    assert all(torch.isnan(s).all() for s in scores.values())


@pytest.mark.parametrize("family", MLLMS)
def test_probe_leaves_nothing_behind(tiny, family):
    model = tiny(family)
    batch = tiny_multimodal_batch(model)
    text, vision = _masks(model, batch)
    with torch.no_grad():
        model(**batch)  # transformers installs InternVL's vision-tower output recorders on the first forward
    before = _state(model)
    vision_impl = model.config.vision_config._attn_implementation
    with AttentionProbe(model) as probe:
        assert model.config.text_config._attn_implementation == PROBE_PREFIX + "sdpa"
        assert model.config.vision_config._attn_implementation == vision_impl
        assert model.config._attn_implementation == "sdpa"
        with pytest.raises(RuntimeError, match="already active"):
            AttentionProbe(model).__enter__()
        with pytest.raises(RuntimeError, match="set_batch"), torch.no_grad():
            model(**batch)
    assert _state(model) == before
    with pytest.raises(ZeroDivisionError), AttentionProbe(model) as probe:
        probe.set_batch(text, vision)
        with torch.no_grad():
            model(**batch)
        1 / 0
    assert _state(model) == before
    assert model.config.text_config._attn_implementation == "sdpa"


def test_probe_rejects_bad_input(tiny):
    model = tiny("internvl")
    with pytest.raises(ValueError, match="out of range"):
        AttentionProbe(model, layers=[2])
    probe = AttentionProbe(model, layers=[0])
    mask = torch.ones(2, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match="both text and vision"):
        probe.set_batch(mask, mask)
    with pytest.raises(ValueError, match=r"\[B, S\]"):
        probe.set_batch(mask, mask[:, :4])
    batch = tiny_multimodal_batch(model)
    text, vision = _masks(model, batch)
    with AttentionProbe(model, layers=[0]) as probe, torch.no_grad():
        probe.set_batch(text[:, 1:], vision[:, 1:])
        with pytest.raises(ValueError, match="do not span"):
            model(**batch)


def test_vision_token_ids(tiny):
    assert get_family(tiny("qwen3_vl_moe")).vision_token_ids() == (120, 121)
    assert get_family(tiny("internvl")).vision_token_ids() == (120,)
    assert get_family(tiny("qwen3_moe")).vision_token_ids() == ()


@pytest.mark.parametrize("family", MLLMS)
def test_tiny_batches_are_valid(tiny, family):
    model = tiny(family)
    special = special_token_ids(model.config)
    image_id = model.config.image_token_id
    for side in ("left", "right"):
        batch = tiny_multimodal_batch(model, batch_size=3, images_per_sample=2, padding_side=side, pad_last=3)
        ids, mask = batch["input_ids"], batch["attention_mask"].bool()
        lengths = mask.sum(1)
        assert lengths[-1] == lengths[0] - 3
        assert (mask[:, 0] if side == "right" else mask[:, -1]).all()
        _, vision = _masks(model, batch)
        first, last = [int(v.nonzero().min()) for v in vision], [int(v.nonzero().max()) for v in vision]
        for b in range(3):  # text before the first and after the last image token
            valid = mask[b].nonzero().flatten()
            assert valid.min() < first[b] and valid.max() > last[b]
            assert not set((ids[b][mask[b] & ~vision[b]]).tolist()) & {image_id}
        if "image_grid_thw" in batch:  # Qwen-VL-style patches (Qwen3-VL, Qwen3-Omni's thinker, GLM-4.5V)
            grid = batch["image_grid_thw"]
            merge = model.config.vision_config.spatial_merge_size
            assert int(vision.sum()) == int((grid.prod(-1) // merge**2).sum())
            assert batch["pixel_values"].shape[0] == int(grid.prod(-1).sum())
            assert torch.equal(batch["mm_token_type_ids"].bool(), vision)
            assert len(set(vision.sum(1).tolist())) > 1  # samples differ in vision token count
        elif family == "gemma4":  # placeholders = valid patches / pooling^2, padded patches at (-1, -1)
            valid_patches = (batch["image_position_ids"] != -1).all(-1).sum(-1)
            pool = model.config.vision_config.pooling_kernel_size ** 2
            assert int(vision.sum()) == int((valid_patches // pool).sum())
            assert batch["pixel_values"].shape[:2] == batch["image_position_ids"].shape[:2]
            assert torch.equal(batch["mm_token_type_ids"].bool(), vision)
            assert len(set(vision.sum(1).tolist())) > 1
        else:
            assert batch["pixel_values"].shape[0] == 6 and int(vision.sum()) == 6 * 4
        with torch.no_grad():
            assert torch.isfinite(model(**batch).logits[mask]).all()
    text_batch = tiny_text_batch(model, batch_size=2, seq_len=9)
    assert not set(text_batch["input_ids"][text_batch["attention_mask"].bool()].tolist()) & special
    assert text_batch["attention_mask"].sum(1).tolist() == [9, 6]


def _reference_low_high(scores, vision, q):
    low, high = torch.zeros_like(vision), torch.zeros_like(vision)
    for b in range(scores.shape[0]):
        items = [(float(scores[b, s]), s) for s in range(scores.shape[1])
                 if vision[b, s] and not math.isnan(float(scores[b, s]))]
        if not items:
            continue
        k = max(1, math.ceil(round(q * len(items), 9)))
        for _, s in sorted(items)[:k]:
            low[b, s] = True
        for _, s in sorted(items, key=lambda t: (-t[0], t[1]))[:k]:
            high[b, s] = True
    return low, high


@pytest.mark.parametrize("q", [0.02, 0.1, 0.07, 0.5, 1.0])
def test_low_high_masks_against_a_sort(q):
    gen = torch.Generator().manual_seed(0)
    scores = torch.rand(5, 120, generator=gen)
    scores[1] = torch.round(scores[1] * 4) / 4  # many ties
    vision = torch.rand(5, 120, generator=gen) < 0.8
    vision[2, :100] = True  # q * n lands on an integer (0.07 * 100 = 7)
    vision[2, 100:] = False
    vision[3] = False  # no vision tokens
    scores[4, ::3] = float("nan")  # unscored vision tokens are in neither set
    low, high = low_high_masks(scores, vision, q=q)
    ref_low, ref_high = _reference_low_high(scores, vision, q)
    assert torch.equal(low, ref_low) and torch.equal(high, ref_high)
    assert not low[3].any() and not high[3].any()
    assert low.sum(1)[0] == max(1, math.ceil(q * int(vision[0].sum()) - 1e-9))
    if q == 0.07:
        assert int(low[2].sum()) == 7
    with pytest.raises(ValueError, match="q must be"):
        low_high_masks(scores, vision, q=0.0)

"""Tiny dense MLLMs (LLaVA-OneVision, Qwen2.5-VL) for MWOP: configs, valid batches, the LightningModule.

Placeholder counts are checked against the models' own vision paths (``get_image_features``), and the
LLaVA-OneVision anyres count against hand-computed values; a padded sample must give the logits it gives alone.
"""

from __future__ import annotations

import pytest
import torch

from lightprune.finetune import MoECausalLM
from lightprune.testing.batches import special_token_ids, tiny_multimodal_batch
from lightprune.testing.images import llava_onevision_image_tokens
from lightprune.testing.tiny import TINY_DENSE_MLLMS, TINY_FAMILIES, tiny_config


def _image_feature_lengths(model, batch) -> list[int]:
    """Per-image feature counts from the model's own vision path."""
    with torch.no_grad():
        if model.config.model_type == "llava_onevision":
            out = model.model.get_image_features(batch["pixel_values"], batch["image_sizes"],
                                                 batch_num_images=batch["batch_num_images"])
        else:
            out = model.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"])
    return [int(f.shape[0]) for f in out.pooler_output]


def test_dense_families_are_separate_and_ids_fit_the_vocab():
    assert TINY_DENSE_MLLMS == ("llava_onevision", "qwen2_5_vl")
    assert not set(TINY_DENSE_MLLMS) & set(TINY_FAMILIES)
    for family in TINY_DENSE_MLLMS:
        config = tiny_config(family)
        text = config.text_config
        assert (text.hidden_size, text.num_attention_heads, text.num_key_value_heads, text.head_dim,
                text.intermediate_size, text.vocab_size) == (32, 4, 2, 8, 24, 128)
        assert 2 <= text.num_hidden_layers <= 3
        assert (config.image_token_id, config.video_token_id) == (120, 121)
        others = {text.pad_token_id, text.bos_token_id, text.eos_token_id}
        assert not others & {120, 121, 122, 123}
        assert max(special_token_ids(config)) < text.vocab_size
    q = tiny_config("qwen2_5_vl")
    assert (q.vision_start_token_id, q.vision_end_token_id) == (122, 123)
    with pytest.raises(ValueError, match="llava_onevision"):
        tiny_config("llava")


@pytest.mark.parametrize("family", TINY_DENSE_MLLMS)
def test_tiny_model_keeps_transformers_init(family):
    """No MoE router / expert re-draw: the weights are exactly a seeded ``from_config``."""
    from transformers import AutoModelForImageTextToText

    from lightprune.testing.tiny import tiny_model

    torch.manual_seed(5)
    reference = AutoModelForImageTextToText.from_config(tiny_config(family), dtype=torch.float32).state_dict()
    built = tiny_model(family, seed=5)
    assert not built.training and built.state_dict().keys() == reference.keys()
    assert all(torch.equal(v, reference[k]) for k, v in built.state_dict().items())
    assert type(built).__name__ == {"llava_onevision": "LlavaOnevisionForConditionalGeneration",
                                    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration"}[family]


def test_llava_onevision_anyres_counts_by_hand(tiny):
    """16x16 tiles of 4x4 features; pinpoints 16x16, 16x32, 32x16, 32x32 (H, W)."""
    config = tiny("llava_onevision").config
    # square 16x16 -> grid 1x1 (4x4 features), nothing unpadded: 16 base + 16 + 4 newlines
    assert llava_onevision_image_tokens(config, 16, 16) == 36
    # 12x30 -> pinpoint 16x32 (fits 32x12 = 360 pixels, like 32x32 but with less waste), grid 4x8;
    # rows round(12*8/30) = 3, padding (4-3)//2 = 0 -> 4x8 kept: 16 + 32 + 4
    assert llava_onevision_image_tokens(config, 12, 30) == 52
    # 28x12 -> pinpoint 32x16, grid 8x4; columns round(12*8/28) = 3, padding 0 -> 8x4: 16 + 32 + 8
    assert llava_onevision_image_tokens(config, 28, 12) == 56
    # 32x32 -> pinpoint 32x32, grid 8x8: 16 + 64 + 8
    assert llava_onevision_image_tokens(config, 32, 32) == 88
    # 8x40 -> 16x32, grid 4x8; rows round(8*8/40) = 2 (1.6), padding 1 -> 2x8: 16 + 16 + 2
    assert llava_onevision_image_tokens(config, 8, 40) == 34
    # an image in a multi-image sample: base tile + one newline
    assert llava_onevision_image_tokens(config, 32, 32, alone=False) == 17


@pytest.mark.parametrize("size", [(16, 16), (12, 30), (28, 12), (32, 32), (8, 40), (5, 60), (64, 20), (20, 17)])
def test_llava_onevision_count_matches_the_model(tiny, size):
    model = tiny("llava_onevision")
    tiles = 5  # the most a 2x2 pinpoint grid needs (base + 4); the model slices what it uses
    batch = {"pixel_values": torch.randn(1, tiles, 3, 16, 16), "image_sizes": torch.tensor([size]),
             "batch_num_images": torch.tensor([1])}
    assert _image_feature_lengths(model, batch) == [llava_onevision_image_tokens(model.config, *size)]


@pytest.mark.parametrize("family", TINY_DENSE_MLLMS)
@pytest.mark.parametrize("images_per_sample,batch_size", [(1, 3), (2, 2), (1, 1)])
def test_batch_counts_equal_image_features_and_loss_backward(tiny, family, images_per_sample, batch_size):
    model = tiny(family)
    batch = tiny_multimodal_batch(model, batch_size=batch_size, images_per_sample=images_per_sample, seed=2)
    per_image = _image_feature_lengths(model, batch)
    assert len(per_image) == batch_size * images_per_sample
    per_sample = torch.tensor(per_image).reshape(batch_size, images_per_sample).sum(1)
    assert torch.equal((batch["input_ids"] == model.config.image_token_id).sum(1), per_sample)
    if batch_size == 3:  # the three LLaVA-OneVision sizes differ in count; Qwen grids alternate
        assert len(set(per_sample.tolist())) >= 2
    model.train()
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    out = model(**batch, labels=labels)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    vision = [p.grad for n, p in model.named_parameters() if ("vision" in n or "visual" in n) and p.grad is not None]
    assert vision and any(g.abs().sum() > 0 for g in vision), "no gradient reached the vision tower"


def _sample(batch, b: int, image_lengths: list[int], model_type: str) -> dict[str, torch.Tensor]:
    """Sample ``b`` of a batch as a batch of one, padding removed."""
    keep = batch["attention_mask"][b].bool()
    one = {"input_ids": batch["input_ids"][b, keep][None], "attention_mask": batch["attention_mask"][b, keep][None]}
    if "mm_token_type_ids" in batch:
        one["mm_token_type_ids"] = batch["mm_token_type_ids"][b, keep][None]
    per = len(image_lengths) // batch["input_ids"].shape[0]
    imgs = slice(b * per, (b + 1) * per)
    if model_type == "llava_onevision":
        one.update(pixel_values=batch["pixel_values"][imgs], image_sizes=batch["image_sizes"][imgs],
                   batch_num_images=batch["batch_num_images"][b:b + 1])
    else:
        patches = batch["image_grid_thw"].prod(-1)
        start = int(patches[:imgs.start].sum())
        one.update(pixel_values=batch["pixel_values"][start:start + int(patches[imgs].sum())],
                   image_grid_thw=batch["image_grid_thw"][imgs])
    return one


@pytest.mark.parametrize("family", TINY_DENSE_MLLMS)
@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_padded_sample_gives_its_unpadded_logits(tiny, family, padding_side):
    model = tiny(family)
    batch = tiny_multimodal_batch(model, batch_size=3, padding_side=padding_side, pad_last=3, seed=4)
    assert (batch["attention_mask"] == 0).any()
    lengths = _image_feature_lengths(model, batch)
    with torch.no_grad():
        full = model(**batch).logits
        for b in range(3):
            alone = model(**_sample(batch, b, lengths, model.config.model_type)).logits[0]
            real = full[b, batch["attention_mask"][b].bool()]
            torch.testing.assert_close(real, alone, atol=1e-4, rtol=1e-4)


def test_text_only_batch_has_no_pixels(tiny):
    for family in TINY_DENSE_MLLMS:
        model = tiny(family)
        batch = tiny_multimodal_batch(model, images_per_sample=0)
        assert "pixel_values" not in batch and not (batch["input_ids"] == 120).any()
        with torch.no_grad():
            assert torch.isfinite(model(**batch).logits).all()


def test_module_accepts_dense_families_and_keeps_task_ids_from_the_model():
    with pytest.raises(ValueError, match="llava_onevision.*qwen2_5_vl"):
        MoECausalLM(tiny="dense_nope")
    module = MoECausalLM(tiny="qwen2_5_vl")
    module.configure_model()
    batch = tiny_multimodal_batch(module.model, batch_size=2, seed=1)
    seen: list[set[str]] = []
    original = module.model.forward

    def spy(*args, **kwargs):
        seen.append(set(kwargs))
        return original(*args, **kwargs)

    module.model.forward = spy
    plain = module._loss(batch)
    tagged = {**batch, "task_ids": torch.tensor([0, 1])}
    torch.testing.assert_close(module._loss(tagged), plain)
    module.validation_step(tagged, 0)
    module(**tagged)
    assert len(seen) == 4 and all("task_ids" not in keys and "input_ids" in keys for keys in seen)
    assert "task_ids" in tagged  # the caller's batch is untouched, callbacks still see it

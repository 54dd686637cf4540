"""Local processors of the tiny MLLMs: placeholder counts the models consume, save/reload, batches through the datamodule."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image
from transformers import AutoProcessor

from lightprune.data import ImageTextJsonlDataModule, tiny_mllm_processor, train_bpe_tokenizer
from lightprune.data.tiny_processor import (
    TINY_PROCESSOR_FAMILIES,
    TinyLlavaOnevisionProcessor,
    TinyQwen2_5VLProcessor,
    tiny_llava_onevision_processor,
    tiny_qwen2_5_vl_processor,
)
from lightprune.testing.images import llava_onevision_image_tokens

CHAT = [{"role": "system", "content": "You answer."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is it?"}]}]
# (W, H) PIL sizes -> hand-computed placeholder counts
# LLaVA-OneVision (16x16 tiles, 4x4 features): see tests/test_tiny_dense_mllm.py for the derivations
LLAVA = {(16, 16): 36, (30, 12): 52, (12, 28): 56, (32, 32): 88, (40, 8): 34}
# Qwen (patch 4, merge 2: one token per 8x8 pixels, area 64..1024): sides round to multiples of 8, so
# 16x16 -> 4 tokens; 30x12 -> 32x16 = 8; 32x32 -> 16; 64x64 (4096 > 1024) -> 32x32 = 16;
# 12x28 -> 16x32 (round(1.5) = 2, round(3.5) = 4: round half to even) = 8
QWEN = {(16, 16): 4, (30, 12): 8, (32, 32): 16, (64, 64): 16, (12, 28): 8}


def _image(size, seed=0):
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (size[1], size[0], 3), generator=gen, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy(), "RGB")


def _features(model, out) -> list[int]:
    with torch.no_grad():
        if model.config.model_type == "llava_onevision":
            feats = model.model.get_image_features(out["pixel_values"], out["image_sizes"],
                                                   batch_num_images=out["batch_num_images"])
        else:
            feats = model.model.get_image_features(out["pixel_values"], out["image_grid_thw"])
    return [int(f.shape[0]) for f in feats.pooler_output]


@pytest.fixture(scope="module")
def processors():
    return {family: tiny_mllm_processor(family) for family in TINY_PROCESSOR_FAMILIES}


@pytest.mark.parametrize("family", ["llava_onevision", "qwen2_5_vl", "qwen3_vl_moe"])
def test_placeholders_equal_the_model_features_and_forward_runs(tiny, processors, family):
    model, processor = tiny(family), processors[family]
    expected = LLAVA if family == "llava_onevision" else QWEN
    text = processor.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    for size, count in expected.items():
        out = processor(text=[text], images=[_image(size)], return_tensors="pt")
        placeholders = int((out["input_ids"] == model.config.image_token_id).sum())
        assert placeholders == count, (size, placeholders)
        assert _features(model, out) == [count]
        if family == "llava_onevision":
            assert count == llava_onevision_image_tokens(model.config, size[1], size[0])
        with torch.no_grad():
            logits = model(**out).logits
        assert logits.shape == (1, out["input_ids"].shape[1], model.config.text_config.vocab_size)


def test_tokenizers_pin_the_config_ids_and_render_the_family_placeholder(tiny, processors):
    llava = processors["llava_onevision"]
    assert llava.tokenizer.convert_tokens_to_ids(["<image>", "<video>"]) == [120, 121]
    assert llava.image_token_id == 120 and llava.num_image_tokens == 16
    rendered = llava.apply_chat_template(CHAT, tokenize=False)
    assert "<|im_start|>user\n<image>What colour is it?<|im_end|>" in rendered and "vision_start" not in rendered
    qwen = processors["qwen2_5_vl"]
    ids = ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]
    assert qwen.tokenizer.convert_tokens_to_ids(ids) == [120, 121, 122, 123]
    assert "<|vision_start|><|image_pad|><|vision_end|>What colour" in qwen.apply_chat_template(CHAT, tokenize=False)
    for processor in processors.values():
        tok = processor.tokenizer
        assert len(tok) <= 128 and (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 1, 2)
    config = tiny("qwen2_5_vl").config.text_config
    assert (config.pad_token_id, config.eos_token_id, config.bos_token_id) == (0, 1, 2)


@pytest.mark.parametrize("family,cls", [("llava_onevision", TinyLlavaOnevisionProcessor),
                                        ("qwen2_5_vl", TinyQwen2_5VLProcessor)])
def test_saved_processor_reloads_with_auto_processor(tmp_path, processors, family, cls):
    processor = processors[family]
    processor.save_pretrained(tmp_path)
    loaded = AutoProcessor.from_pretrained(str(tmp_path), local_files_only=True)
    assert type(loaded) is cls
    text = processor.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    images = [_image((30, 12), seed=1)]
    a = processor(text=[text], images=images, return_tensors="pt")
    b = loaded(text=[text], images=images, return_tensors="pt")
    assert sorted(a) == sorted(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_builders_check_their_arguments(tiny):
    with pytest.raises(ValueError, match="llava_onevision"):
        tiny_mllm_processor("internvl")
    wrong = train_bpe_tokenizer(["abc"], 128, image_tokens=("<image>", "<video>"))
    with pytest.raises(ValueError, match="120"):
        tiny_llava_onevision_processor(tokenizer=wrong)
    with pytest.raises(ValueError, match="min_pixels"):
        tiny_qwen2_5_vl_processor(min_pixels=16)
    config = tiny("llava_onevision").config
    config.vision_feature_select_strategy = "default"
    with pytest.raises(ValueError, match="'default'"):
        tiny_llava_onevision_processor(config)


@pytest.mark.parametrize("family", ["llava_onevision", "qwen2_5_vl"])
def test_datamodule_batches_mixed_image_sizes_and_text_rows(tmp_path, tiny, processors, family):
    """A batch of differently sized images (LLaVA: 2, 3 and 5 tiles) and a text-only row runs through the model."""
    sizes = [(16, 16), (30, 12), (32, 32)]
    rows = []
    for i, size in enumerate(sizes):
        _image(size, seed=i).save(tmp_path / f"{i}.png")
        rows.append({"image": f"{i}.png", "messages": [{"role": "user", "content": "Colour?"},
                                                       {"role": "assistant", "content": "red"}]})
    rows.append({"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]})
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dm = ImageTextJsonlDataModule(processors[family], train=str(path), batch_size=4)
    assert dm.task_names is None
    batch = next(iter(dm.calibration_dataloader()))
    assert "task_ids" not in batch
    model = tiny(family)
    counts = (batch["input_ids"] == 120).sum(1).tolist()
    expected = LLAVA if family == "llava_onevision" else QWEN
    assert counts == [expected[s] for s in sizes] + [0]
    if family == "llava_onevision":
        assert batch["pixel_values"].shape[:2] == (3, 5) and batch["image_sizes"].tolist() == [[16, 16], [12, 30],
                                                                                              [32, 32]]
    out = model(**batch)
    assert torch.isfinite(out.logits).all()

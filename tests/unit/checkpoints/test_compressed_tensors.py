"""compressed-tensors checkpoints (int4 W4A16 as Kimi K2 Thinking ships its experts, FP8 per channel as the
"FP8-dynamic" releases) read, scored, calibrated and pruned in their own format.

References: compressed-tensors' own unpacking and dequantization (through transformers' loading with
``CompressedTensorsConfig(dequantize=True)``), the stored bytes, and the masked source's logits.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import lightprune as lp
from lightprune.checkpoints.compressed_tensors import dequantize_int4, pack_int4, quantize_int4
from lightprune.testing.batches import tiny_text_batch
from lightprune.testing.tiny import tiny_model
from tests.fixtures.shipped import (
    corrupted_copy,
    stored_tensors,
    write_compressed_tensors,
    write_deepseek_with_mtp,
)


def _library():
    try:
        import compressed_tensors  # noqa: F401
    except ImportError:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            "compressed-tensors is not installed (pip install -e '.[dev]' brings it): transformers needs it to load "
            "the reference")


def _load(path: Path):
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    config = CompressedTensorsConfig(dequantize=True)
    return AutoModelForCausalLM.from_pretrained(path, quantization_config=config).eval()


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> dict[str, Path]:
    """{"int4": a DeepSeek-V3 (Kimi K2's architecture, its MTP layer 3 too) with W4A16 experts, "fp8": a Qwen3-MoE
    in FP8 per channel}."""
    _library()
    root = tmp_path_factory.mktemp("compressed")
    qwen = tiny_model("qwen3_moe", hidden_size=64, moe_intermediate_size=32, intermediate_size=64).to(torch.bfloat16)
    qwen.config.dtype = torch.bfloat16
    qwen.save_pretrained(root / "qwen3_moe")
    return {"int4": write_compressed_tensors(write_deepseek_with_mtp(root / "deepseek_v3"), root / "int4", "int4"),
            "fp8": write_compressed_tensors(root / "qwen3_moe", root / "fp8", "fp8")}


def test_int4_packing_and_dequantization_are_compressed_tensors():
    _library()
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32

    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(6, 64, generator=gen) * 0.1).to(torch.bfloat16)
    values, scale = quantize_int4(weight, 32)
    packed = pack_int4(values)
    assert torch.equal(packed, pack_to_int32(values, 4))
    assert torch.equal(unpack_from_int32(packed, 4, torch.Size([6, 64])), values)
    want = (values.to(scale.dtype).unflatten(-1, (2, 32)) * scale.unsqueeze(-1)).flatten(-2)  # its _dequantize
    for dtype in (torch.bfloat16, torch.float32):
        assert torch.equal(dequantize_int4(packed, scale, (6, 64), dtype), want.to(dtype))


@pytest.mark.parametrize("scheme", ["int4", "fp8"])
def test_scores_and_calibration_equal_those_of_the_model_transformers_loads(releases, scheme):
    path = releases[scheme]
    model = _load(path)
    for criterion in ("aimer", "magnitude", "router_norm"):
        want, got = lp.score_weights(model, criterion), lp.score_weights(path, criterion, progress=False)
        assert all(torch.equal(got.raw[i], want.raw[i]) for i in want), criterion
    batches = [tiny_text_batch(model, batch_size=2, seq_len=8, seed=s) for s in range(2)]
    kwargs = dict(criteria=["frequency", "reap", "ean"], progress=False)
    want = lp.collect_expert_stats(model, batches, **kwargs)
    got = lp.collect_expert_stats(path, batches, batches_per_pass=1, **kwargs)
    for criterion in kwargs["criteria"]:
        have, expected = got.raw(criterion, "all"), want.raw(criterion, "all")
        assert have.keys() == expected.keys() and all(torch.equal(have[i], expected[i]) for i in expected), criterion


@pytest.mark.parametrize("scheme", ["int4", "fp8"])
def test_a_streamed_prune_copies_the_kept_experts_parts_and_gives_the_masked_logits(releases, scheme, tmp_path):
    path = releases[scheme]
    scores = lp.score_weights(path, "aimer", progress=False)
    plan = lp.select_experts(scores, 0.5)
    lp.prune_checkpoint(path, plan, tmp_path / "out", progress=False)
    before, after = stored_tensors(path), stored_tensors(tmp_path / "out")
    parts = ("weight_packed", "weight_scale", "weight_shape") if scheme == "int4" else ("weight", "weight_scale")
    for layer, kept in plan.keep.items():
        for new, old in enumerate(kept):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                for part in parts:
                    was = before[f"model.layers.{layer}.mlp.experts.{old}.{proj}.{part}"]
                    now = after[f"model.layers.{layer}.mlp.experts.{new}.{proj}.{part}"]
                    assert now.dtype == was.dtype and torch.equal(now.view(torch.uint8), was.view(torch.uint8))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "compressed-tensors"
    source, ids = _load(path), torch.randint(0, 100, (2, 10), generator=torch.Generator().manual_seed(1))
    model_plan = lp.ExpertPlan(keep={i: k for i, k in plan.keep.items() if i < source.config.num_hidden_layers},
                               num_experts={i: n for i, n in plan.num_experts.items()
                                            if i < source.config.num_hidden_layers})
    with torch.no_grad(), lp.mask_experts(source, model_plan):
        masked = source(ids).logits
    with torch.no_grad():
        assert torch.equal(_load(tmp_path / "out")(ids).logits, masked)
        assert torch.equal(lp.load_pruned(tmp_path / "out")(ids).logits, masked)


_KEY = "model.layers.1.mlp.experts.2.down_proj.weight"


@pytest.mark.parametrize("change, message", [
    (lambda t, c: t.pop(_KEY + "_scale"), rf"without their weight_scale or weight_shape \(the scales missing\): "
                                          rf"{_KEY}_packed"),
    (lambda t, c: t.__setitem__(_KEY + "_scale", t[_KEY + "_scale"][:, :0].contiguous()),
     rf"scales do not fit them \(group_size 32\): {_KEY}_packed \[64, 4\], {_KEY}_scale \[64, 0\]"),
    (lambda t, c: t.__setitem__(_KEY + "_packed", t[_KEY + "_packed"].view(torch.float32)), r"not int32"),
    (lambda t, c: t.__setitem__(_KEY + "_zero_point", torch.zeros(64, 1, dtype=torch.int32)),
     r"scheme lightprune does not read .*weight_zero_point"),
    (lambda t, c: c["quantization_config"]["config_groups"]["group_0"]["weights"].__setitem__("symmetric", False),
     r"asymmetric, activation-ordered or block-wise"),
    (lambda t, c: c["quantization_config"]["config_groups"]["group_0"]["weights"].__setitem__("num_bits", 8),
     r"int 8-bit group in format 'pack-quantized', which lightprune does not read"),
    (lambda t, c: c["quantization_config"].__setitem__("ignore", ["re:.*experts.*"]),
     r"names modules stored quantized"),
    (lambda t, c: c["quantization_config"].__setitem__("ignore", ["re:.*vision_tower.*"]),
     r"names re:.\*vision_tower.\*, which the checkpoint holds no tensors of"),
], ids=["scale-missing", "scale-shape", "packed-dtype", "zero-point", "asymmetric", "int8", "ignored-quantized",
        "ignored-absent"])
def test_the_strict_reader_refuses_a_corrupt_int4_checkpoint_in_one_line(releases, tmp_path, change, message):
    bad = corrupted_copy(releases["int4"], tmp_path / "bad", change, "model-00001-of-00002.safetensors")
    for call in (lambda: lp.score_weights(bad, progress=False), lambda: lp.load_pruned(bad)):
        with pytest.raises(ValueError, match=message) as found:
            call()
        assert "\n" not in str(found.value) and str(bad) in str(found.value)

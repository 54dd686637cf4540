"""MXFP4 checkpoints (quant_method "mxfp4", as gpt-oss ships) read, scored, calibrated and pruned in their own format.

References: transformers' own dequantization (``convert_moe_packed_tensors``, and the model ``from_pretrained`` builds
with ``Mxfp4Config(dequantize=True)``), the stored bytes, and the masked source's logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import lightprune as lp
from lightprune.checkpoints.mxfp4 import FP4_VALUES, dequantize_mxfp4, quantize_mxfp4
from lightprune.testing.batches import tiny_text_batch
from tests.fixtures.shipped import corrupted_copy, write_gpt_oss_mxfp4


def _load(path: Path):
    from transformers import AutoModelForCausalLM, Mxfp4Config

    return AutoModelForCausalLM.from_pretrained(path, quantization_config=Mxfp4Config(dequantize=True)).eval()


@pytest.fixture(scope="module")
def mxfp4(tmp_path_factory) -> Path:
    return write_gpt_oss_mxfp4(tmp_path_factory.mktemp("gpt_oss") / "mxfp4")


def test_dequantization_is_transformers_arithmetic():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 2, 16), generator=gen, dtype=torch.uint8)
    scales = torch.randint(110, 140, (3, 10, 2), generator=gen, dtype=torch.uint8)
    for dtype in (torch.bfloat16, torch.float32):
        want = convert_moe_packed_tensors(blocks, scales, dtype=dtype)
        assert torch.equal(dequantize_mxfp4(blocks, scales, dtype), want)


def test_quantization_rounds_each_group_to_its_nearest_e2m1_values():
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(2, 64, 6, generator=gen)
    weight[0, :32, 0] = 0.0  # a group of zeros
    blocks, scales = quantize_mxfp4(weight)
    assert blocks.shape == (2, 6, 2, 16) and scales.shape == (2, 6, 2) and blocks.dtype == scales.dtype == torch.uint8
    got = dequantize_mxfp4(blocks, scales, torch.float32)
    grid = torch.tensor(sorted(set(FP4_VALUES)))
    for e in range(2):
        for row in range(6):
            for group in range(2):
                column = slice(32 * group, 32 * group + 32)
                exponent = int(scales[e, row, group]) - 127
                values = weight[e, column, row]
                if values.abs().max() == 0:
                    assert torch.equal(got[e, column, row], values)
                    continue
                assert values.abs().max() / 2.0 ** exponent <= 6.0 < values.abs().max() / 2.0 ** (exponent - 1)
                nearest = grid[(values[:, None] / 2.0 ** exponent - grid).abs().argmin(dim=1)] * 2.0 ** exponent
                assert torch.allclose(got[e, column, row].abs(), nearest.abs(), rtol=0, atol=0)


def test_transformers_and_lightprune_read_the_same_weights_and_scores(mxfp4):
    model = _load(mxfp4)
    for criterion in ("aimer", "magnitude", "router_norm"):
        want, got = lp.score_weights(model, criterion), lp.score_weights(mxfp4, criterion, progress=False)
        assert got.keys() == want.keys() and all(torch.equal(got.raw[i], want.raw[i]) for i in want), criterion
    batches = [tiny_text_batch(model, batch_size=2, seq_len=8, seed=s) for s in range(2)]
    kwargs = dict(criteria=["frequency", "reap", "ean"], progress=False)
    want = lp.collect_expert_stats(model, batches, **kwargs)
    got = lp.collect_expert_stats(mxfp4, batches, batches_per_pass=1, **kwargs)
    for criterion in kwargs["criteria"]:
        have, expected = got.raw(criterion, "all"), want.raw(criterion, "all")
        assert have.keys() == expected.keys() and all(torch.equal(have[i], expected[i]) for i in expected), criterion


def test_a_streamed_mxfp4_prune_copies_the_kept_experts_blocks_and_gives_the_masked_logits(mxfp4, tmp_path):
    plan = lp.select_experts(lp.score_weights(mxfp4, "aimer", progress=False), 0.5)
    lp.prune_checkpoint(mxfp4, plan, tmp_path / "out", progress=False)
    before, after = load_file(mxfp4 / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    for layer, kept in plan.keep.items():
        head = f"model.layers.{layer}.mlp"
        for part in ("gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks", "down_proj_scales",
                     "gate_up_proj_bias"):
            assert torch.equal(after[f"{head}.experts.{part}"], before[f"{head}.experts.{part}"][kept]), part
        assert torch.equal(after[f"{head}.router.weight"], before[f"{head}.router.weight"][kept])
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "mxfp4" and config["num_local_experts"] == 4
    source, ids = _load(mxfp4), torch.randint(0, 100, (2, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), lp.mask_experts(source, plan):
        masked = source(ids).logits
    with torch.no_grad():
        assert torch.equal(_load(tmp_path / "out")(ids).logits, masked)
        assert torch.equal(lp.load_pruned(tmp_path / "out")(ids).logits, masked)


_KEY = "model.layers.0.mlp.experts.down_proj"


@pytest.mark.parametrize("change, message", [
    (lambda t, c: t.pop(_KEY + "_scales"), rf"blocks without their scales \(the scales missing\): {_KEY}_blocks"),
    (lambda t, c: t.__setitem__(_KEY + "_scales", t[_KEY + "_scales"][:, :32].contiguous()),
     rf"scales whose shape is not their blocks' groups: {_KEY}_scales \[8, 32, 1\] for \[8, 64, 1, 16\]"),
    (lambda t, c: t.__setitem__(_KEY + "_blocks", t[_KEY + "_blocks"].to(torch.int32)), r"not in uint8"),
    (lambda t, c: c["quantization_config"].__setitem__("modules_to_not_convert", ["model.layers.*.mlp.gate"]),
     r"names model.layers.\*.mlp.gate, which the checkpoint holds no tensors of"),
    (lambda t, c: c["quantization_config"].__setitem__("modules_to_not_convert", ["model.layers.*.mlp.experts"]),
     r"names modules stored quantized"),
], ids=["scales-missing", "scales-shape", "blocks-dtype", "ignored-absent", "ignored-quantized"])
def test_the_strict_reader_refuses_a_corrupt_mxfp4_checkpoint_in_one_line(mxfp4, tmp_path, change, message):
    bad = corrupted_copy(mxfp4, tmp_path / "bad", change)
    for call in (lambda: lp.score_weights(bad, progress=False), lambda: lp.load_pruned(bad)):
        with pytest.raises(ValueError, match=message) as found:
            call()
        assert "\n" not in str(found.value) and str(bad) in str(found.value)

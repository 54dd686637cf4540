"""FP8 block-scaled checkpoints (quant_method "fp8", as DeepSeek-V3, Qwen3-FP8 and GLM-4.5-FP8 ship) read, scored,
calibrated and pruned in their own format (a DeepSeek-V3 with its MTP layer); prune, then quantize.

References are independent of lightprune's reading: transformers' own dequantization (its ``Fp8Dequantize``, and the
model ``from_pretrained`` builds from the checkpoint on the CPU), the stored bytes, and the masked source's logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import lightprune as lp
from lightprune.checkpoints.fp8_blocks import dequantize_fp8_blocks, quantize_fp8_blocks
from lightprune.testing.batches import tiny_text_batch
from tests.fixtures.shipped import corrupted_copy, stored_tensors, write_deepseek_with_mtp, write_fused_fp8

BLOCK = (8, 8)


def _transformers_dequantize(values: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    return Fp8Dequantize(None)._dequantize_one(values, scale, output_dtype=dtype)


def _load(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).eval()  # on the CPU transformers dequantizes


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> tuple[Path, Path]:
    """(a float DeepSeek-V3 with its MTP layer 3, the same quantized by lp.quantize_checkpoint in 8x8 blocks)."""
    root = tmp_path_factory.mktemp("shipped")
    float_dir = write_deepseek_with_mtp(root / "float")
    return float_dir, lp.quantize_checkpoint(float_dir, root / "fp8", block=BLOCK, progress=False)


# ------------------------------------------------------------------------------------------- the format's arithmetic
@pytest.mark.parametrize("shape", [(16, 24), (3, 8, 16)])
def test_dequantization_is_transformers_arithmetic(shape):
    weight = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 0.1
    values, scale = quantize_fp8_blocks(weight, BLOCK)
    for dtype in (torch.bfloat16, torch.float32):
        assert torch.equal(dequantize_fp8_blocks(values, scale, BLOCK, dtype),
                           _transformers_dequantize(values, scale, dtype))


def test_quantization_is_within_float8_rounding_and_partial_blocks_follow_their_block():
    weight = torch.randn(20, 13, generator=torch.Generator().manual_seed(1))
    weight[0:8, 0:8] = 0.0  # a block of zeros: scale 1, values 0
    values, scale = quantize_fp8_blocks(weight, BLOCK)
    assert values.dtype == torch.float8_e4m3fn and scale.shape == (3, 2) and scale.dtype == torch.float32
    got = dequantize_fp8_blocks(values, scale, BLOCK, torch.float32)
    for i in range(20):  # brute force: each element times the scale of the block it falls in
        for j in range(13):
            assert got[i, j] == values[i, j].float() * scale[i // 8, j // 8]
            bound = abs(weight[i, j]) * 2.0 ** -4 + scale[i // 8, j // 8] * 2.0 ** -10
            assert abs(got[i, j] - weight[i, j]) <= bound
    amax = weight[8:16, 0:8].abs().max()
    assert scale[1, 0] == amax / 448.0 and scale[0, 0] == 1.0


# ------------------------------------------------------------------------------------------------- the written format
def test_quantize_checkpoint_writes_the_deepseek_layout(shipped):
    float_dir, fp8_dir = shipped
    stored, source = stored_tensors(fp8_dir), stored_tensors(float_dir)
    config = json.loads((fp8_dir / "config.json").read_text())
    assert config["quantization_config"] == {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                             "weight_block_size": list(BLOCK)}
    fp8 = {k for k, v in stored.items() if v.dtype == torch.float8_e4m3fn}
    assert "model.layers.1.mlp.experts.5.up_proj.weight" in fp8 and "model.layers.0.self_attn.q_b_proj.weight" in fp8
    for kept in ("model.layers.1.mlp.gate.weight", "lm_head.weight", "model.embed_tokens.weight",
                 "model.layers.1.mlp.gate.e_score_correction_bias", "model.layers.1.input_layernorm.weight"):
        assert stored[kept].dtype == torch.bfloat16 and torch.equal(stored[kept], source[kept]), kept
    assert {k.removesuffix("_scale_inv") for k in stored if k.endswith("_scale_inv")} == fp8
    for key in fp8:
        rows, cols = stored[key].shape
        assert stored[key + "_scale_inv"].shape == (rows // 8, cols // 8)


def test_transformers_loads_what_lightprune_reads(shipped):
    _, fp8_dir = shipped
    model = _load(fp8_dir)
    from lightprune.checkpoints import Checkpoint, Skeleton

    with Checkpoint(fp8_dir) as checkpoint:
        skeleton = Skeleton(checkpoint)
        with skeleton.resident("model.layers.1", "model.layers.2"):
            theirs = dict(model.named_parameters())
            for name, tensor in skeleton.model.named_parameters():
                if name.startswith(("model.layers.1.", "model.layers.2.")):
                    assert tensor.dtype == theirs[name].dtype and torch.equal(tensor, theirs[name]), name


# ---------------------------------------------------------------------------------------- scores, calibration, prune
def test_weight_scores_of_an_fp8_checkpoint_equal_those_of_the_model_transformers_loads(shipped):
    _, fp8_dir = shipped
    model = _load(fp8_dir)
    for criterion in ("aimer", "magnitude", "router_norm"):
        want, got = lp.score_weights(model, criterion), lp.score_weights(fp8_dir, criterion, progress=False)
        assert sorted(got) == [1, 2, 3]  # the MTP layer 3 scored from its own weights
        assert all(torch.equal(got.raw[i], want.raw[i]) for i in want), criterion


def test_calibration_of_an_fp8_checkpoint_equals_the_in_memory_one(shipped):
    _, fp8_dir = shipped
    model = _load(fp8_dir)
    batches = [tiny_text_batch(model, batch_size=2, seq_len=8, seed=s, pad=s == 1) for s in range(2)]
    kwargs = dict(criteria=["frequency", "reap", "ean", "delta_h"], progress=False)
    want = lp.collect_expert_stats(model, batches, **kwargs)
    got = lp.collect_expert_stats(fp8_dir, batches, batches_per_pass=1, **kwargs)
    for criterion in kwargs["criteria"]:
        have, expected = got.raw(criterion, "all"), want.raw(criterion, "all")
        assert have.keys() == expected.keys() == {1, 2}
        assert all(torch.equal(have[i], expected[i]) for i in expected), criterion


def test_a_streamed_fp8_prune_copies_the_kept_bytes_and_gives_the_masked_logits(shipped, tmp_path):
    _, fp8_dir = shipped
    plan = lp.select_experts(lp.score_weights(fp8_dir, "aimer", progress=False), 0.5)
    result = lp.prune_checkpoint(fp8_dir, plan, tmp_path / "out", progress=False)
    before, after = stored_tensors(fp8_dir), stored_tensors(tmp_path / "out")
    for layer in (1, 2, 3):
        for new, old in enumerate(plan.keep[layer]):
            for part in ("gate_proj.weight", "gate_proj.weight_scale_inv", "up_proj.weight", "up_proj.weight_scale_inv",
                         "down_proj.weight", "down_proj.weight_scale_inv"):
                was = before[f"model.layers.{layer}.mlp.experts.{old}.{part}"]
                now = after[f"model.layers.{layer}.mlp.experts.{new}.{part}"]
                assert now.dtype == was.dtype and torch.equal(now.view(torch.uint8), was.view(torch.uint8))
        assert f"model.layers.{layer}.mlp.experts.4.gate_proj.weight" not in after
        assert torch.equal(after[f"model.layers.{layer}.mlp.gate.weight"],
                           before[f"model.layers.{layer}.mlp.gate.weight"][plan.keep[layer]])
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "fp8" and config["n_routed_experts"] == 4
    manifest = json.loads((tmp_path / "out" / "lightprune_export.json").read_text())
    assert manifest["quantization"]["quant_method"] == "fp8" and manifest["mtp_layers"]["3"]["kept"] == plan.keep[3]
    source, ids = _load(fp8_dir), torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    model_plan = lp.ExpertPlan(keep={i: plan.keep[i] for i in (1, 2)}, num_experts={1: 8, 2: 8})
    with torch.no_grad(), lp.mask_experts(source, model_plan):
        masked = source(ids).logits
    with torch.no_grad():
        assert torch.equal(_load(tmp_path / "out")(ids).logits, masked)
        assert torch.equal(lp.load_pruned(tmp_path / "out")(ids).logits, masked)
    assert result.verification["max_abs_diff"] == 0.0


#: family -> (its router's per-expert tensors in the MoE block, the config key of its expert count, the router rows
#: after the experts': LongCat-Flash's zero-computation experts)
_ROUTERS = {"qwen3_moe": (("gate.weight",), "num_local_experts", []),
            "longcat_flash": (("router.classifier.weight", "router.e_score_correction_bias"), "n_routed_experts",
                              [8, 9])}


@pytest.mark.parametrize("family", sorted(_ROUTERS))
def test_an_fp8_prune_of_per_expert_keys_copies_the_kept_bytes_and_gives_the_masked_logits(tmp_path, family):
    """Qwen3-MoE and LongCat-Flash (its router holds E + Z rows, the zero-computation experts' last) quantized in FP8
    blocks, their experts per-expert keys on disk: the kept experts' bytes and scales are the source's, the router
    rows (and correction bias) are the kept experts' (then all Z), and transformers' reload gives the masked
    source's logits."""
    from lightprune.testing.tiny import tiny_model

    routers, count_key, after_experts = _ROUTERS[family]
    tiny_model(family, seed=2).to(torch.bfloat16).save_pretrained(tmp_path / "float")
    fp8_dir = lp.quantize_checkpoint(tmp_path / "float", tmp_path / "fp8", block=BLOCK, progress=False)
    plan = lp.select_experts(lp.score_weights(fp8_dir, "aimer", progress=False), 0.5)
    lp.prune_checkpoint(fp8_dir, plan, tmp_path / "out", progress=False)
    before, after = stored_tensors(fp8_dir), stored_tensors(tmp_path / "out")
    for layer, keep in plan.keep.items():
        for new, old in enumerate(keep):
            for part in ("gate_proj.weight", "gate_proj.weight_scale_inv", "down_proj.weight_scale_inv"):
                was = before[f"model.layers.{layer}.mlp.experts.{old}.{part}"]
                now = after[f"model.layers.{layer}.mlp.experts.{new}.{part}"]
                assert now.dtype == was.dtype and torch.equal(now.view(torch.uint8), was.view(torch.uint8))
        for name in routers:
            assert torch.equal(after[f"model.layers.{layer}.mlp.{name}"],
                               before[f"model.layers.{layer}.mlp.{name}"][keep + after_experts])
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config[count_key] == 4 and config["quantization_config"]["quant_method"] == "fp8"
    source, ids = _load(fp8_dir), torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), lp.mask_experts(source, plan):
        masked = source(ids).logits
    with torch.no_grad():
        assert torch.equal(_load(tmp_path / "out")(ids).logits, masked)


def test_fused_fp8_experts_score_calibrate_and_prune_as_transformers_dequantizes_them(tmp_path):
    """Experts fused on disk (Llama 4's ``experts.gate_up_proj`` [E, H, 2I]) in FP8 blocks: weight scores and
    calibration equal those of the model transformers' arithmetic dequantizes from them; a streamed prune slices the
    fused values and scales by expert, byte for byte, and its dequantized output gives the masked reference's
    logits."""
    from transformers import AutoModelForCausalLM

    fp8_dir, ref_dir = write_fused_fp8(tmp_path / "fp8", tmp_path / "reference", BLOCK)
    reference = AutoModelForCausalLM.from_pretrained(ref_dir).eval()
    for criterion in ("aimer", "magnitude"):
        want, got = lp.score_weights(reference, criterion), lp.score_weights(fp8_dir, criterion, progress=False)
        assert got.raw.keys() == want.raw.keys() == {1, 2}
        assert all(torch.equal(got.raw[i], want.raw[i]) for i in want), criterion
    batches = [tiny_text_batch(reference, batch_size=2, seq_len=8, seed=s, pad=s == 1) for s in range(2)]
    kwargs = dict(criteria=["frequency", "reap", "delta_h"], progress=False)
    want = lp.collect_expert_stats(reference, batches, **kwargs)
    got = lp.collect_expert_stats(fp8_dir, batches, **kwargs)
    for criterion in kwargs["criteria"]:
        assert all(torch.equal(got.raw(criterion, "all")[i], want.raw(criterion, "all")[i]) for i in (1, 2))

    plan = lp.select_experts(lp.score_weights(fp8_dir, "aimer", progress=False), 0.5)
    result = lp.prune_checkpoint(fp8_dir, plan, tmp_path / "out", progress=False)
    before, after = stored_tensors(fp8_dir), stored_tensors(tmp_path / "out")
    for layer, keep in plan.keep.items():
        for name in ("gate_up_proj", "gate_up_proj_scale_inv", "down_proj", "down_proj_scale_inv"):
            key = f"model.layers.{layer}.feed_forward.experts.{name}"
            assert after[key].dtype == before[key].dtype
            assert torch.equal(after[key].view(torch.uint8), before[key][keep].view(torch.uint8)), key
    dequantized = tmp_path / "dequantized"  # the output as transformers' arithmetic reads it, tensor by tensor
    dequantized.mkdir()
    tensors = {key: value if f"{key}_scale_inv" not in after else
               _transformers_dequantize(value, after[f"{key}_scale_inv"], torch.bfloat16)
               for key, value in after.items() if not key.endswith("_scale_inv")}
    save_file(tensors, dequantized / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "fp8" and config["num_local_experts"] == 4
    del config["quantization_config"]
    (dequantized / "config.json").write_text(json.dumps(config))
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), lp.mask_experts(reference, plan):
        masked = reference(ids).logits
    with torch.no_grad():
        assert torch.equal(AutoModelForCausalLM.from_pretrained(dequantized).eval()(ids).logits, masked)
    assert result.verification["max_abs_diff"] == 0.0


def test_an_in_memory_prune_of_the_loaded_fp8_model_gives_the_masked_logits_and_its_fp8_bytes(shipped, tmp_path):
    """The model lp.load_pruned reads from an FP8 checkpoint is dequantized: export_pruned writes it in bf16 (the masked
    model's logits exactly), or with quantize="fp8" in the source's blocks, where each kept expert's values and scales
    come back byte for byte (its scales were its blocks' amax / 448). The MTP layer, which the loaded model does not
    hold, is not written, and config.json says so (num_nextn_predict_layers 0)."""
    _, fp8_dir = shipped
    model = lp.load_pruned(fp8_dir)
    plan = lp.select_experts(lp.score_weights(model, "aimer"), 0.25)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad(), lp.mask_experts(model, plan):
        masked = model(ids).logits
    lp.export_pruned(model, plan, tmp_path / "bf16")
    with torch.no_grad():
        assert torch.equal(lp.load_pruned(tmp_path / "bf16")(ids).logits, masked)
    config = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 0 and "quantization_config" not in config
    manifest = json.loads((tmp_path / "bf16" / "lightprune_export.json").read_text())
    assert manifest["mtp_layers"].startswith("not written")

    model = lp.load_pruned(fp8_dir)
    lp.export_pruned(model, plan, tmp_path / "fp8", quantize="fp8")
    before, after = stored_tensors(fp8_dir), stored_tensors(tmp_path / "fp8")
    config = json.loads((tmp_path / "fp8" / "config.json").read_text())
    assert config["quantization_config"]["weight_block_size"] == [8, 8]
    for layer, kept in plan.keep.items():
        for new, old in enumerate(kept):
            for part in ("gate_proj.weight", "gate_proj.weight_scale_inv", "down_proj.weight",
                         "down_proj.weight_scale_inv"):
                was = before[f"model.layers.{layer}.mlp.experts.{old}.{part}"]
                assert torch.equal(after[f"model.layers.{layer}.mlp.experts.{new}.{part}"].view(torch.uint8),
                                   was.view(torch.uint8)), (layer, old, part)


# ----------------------------------------------------------------------------------------------- strict refusals
def _corrupted(fp8_dir: Path, tmp_path: Path, change) -> Path:
    return corrupted_copy(fp8_dir, tmp_path / "bad", change, "model-00001-of-00002.safetensors")


_KEY = "model.layers.1.mlp.experts.2.down_proj.weight"


@pytest.mark.parametrize("change, message", [
    (lambda t, c: t.pop(_KEY + "_scale_inv"), rf"without their weight_scale_inv \(the scales missing\): {_KEY}"),
    (lambda t, c: t.__setitem__(_KEY + "_scale_inv", torch.ones(8, 2)),
     rf"not the 8x8 block grid of their weight: {_KEY}_scale_inv \[8, 2\] for \[64, 32\] \(wants \[8, 4\]\)"),
    (lambda t, c: t.__setitem__(_KEY + "_scale_inv", torch.ones(8, 4, dtype=torch.int32)),
     rf"scales not in F32/BF16: {_KEY}_scale_inv \(I32\)"),
    (lambda t, c: t.__setitem__(_KEY, t[_KEY].to(torch.float8_e5m2)), rf"not in e4m3: {_KEY} \(F8_E5M2\)"),
    (lambda t, c: c["quantization_config"].__setitem__("weight_block_size", [8]), r"\"weight_block_size\": \[8\]"),
    (lambda t, c: c["quantization_config"].__setitem__("modules_to_not_convert", ["model.layers.9.mlp"]),
     r"names model.layers.9.mlp, which the checkpoint holds no tensors of"),
    (lambda t, c: c["quantization_config"].__setitem__("modules_to_not_convert",
                                                        ["model.layers.1.mlp.experts.2.down_proj"]),
     r"names modules stored quantized \(model.layers.1.mlp.experts.2.down_proj.weight\)"),
    (lambda t, c: c.pop("quantization_config"), r"float8 weights with their block scales \(.*_scale_inv.* no quant"),
    (lambda t, c: c["quantization_config"].__setitem__("quant_method", "gptq"), r"quant_method \"gptq\": GPTQ"),
    (lambda t, c: c["quantization_config"].__setitem__("quant_method", "mxfp4"),
     r"declares quant_method \"mxfp4\" .* holds no \*_blocks tensors"),
    (lambda t, c: c["quantization_config"].__setitem__("quant_method", "compressed-tensors"),
     r"quantization_config \(compressed-tensors\) has \"config_groups\": null"),
], ids=["scale-missing", "block-shape", "scale-dtype", "e5m2", "block-size", "ignored-absent", "ignored-quantized",
        "no-config", "gptq", "mxfp4", "compressed-tensors"])
def test_the_strict_reader_refuses_a_corrupt_fp8_checkpoint_in_one_line(shipped, tmp_path, change, message):
    _, fp8_dir = shipped
    bad = _corrupted(fp8_dir, tmp_path, change)
    for call in (lambda: lp.score_weights(bad, progress=False), lambda: lp.load_pruned(bad),
                 lambda: lp.prune_checkpoint(bad, lp.ExpertPlan(keep={}, num_experts={}), tmp_path / "o")):
        with pytest.raises(ValueError, match=message) as found:
            call()
        assert "\n" not in str(found.value) and str(bad) in str(found.value)


# ------------------------------------------------------------------------------------------- prune, then quantize
def test_prune_then_quantize_in_one_call_equals_the_two_steps(shipped, tmp_path):
    """prune_checkpoint(quantize="fp8") and export_pruned(quantize="fp8") write what quantize_checkpoint writes of
    the verified float export, tensor for tensor; the manifest says so."""
    float_dir, _ = shipped
    plan = lp.select_experts(lp.score_weights(float_dir, "aimer", progress=False), 0.5)
    lp.prune_checkpoint(float_dir, plan, tmp_path / "bf16", progress=False)
    lp.quantize_checkpoint(tmp_path / "bf16", tmp_path / "two-steps", progress=False)
    result = lp.prune_checkpoint(float_dir, plan, tmp_path / "one-call", progress=False, quantize="fp8")
    two, one = stored_tensors(tmp_path / "two-steps"), stored_tensors(tmp_path / "one-call")
    assert two.keys() == one.keys() and all(torch.equal(two[k].view(torch.uint8), one[k].view(torch.uint8))
                                            for k in two if two[k].dtype == torch.float8_e4m3fn)
    assert all(torch.equal(two[k], one[k]) for k in two if two[k].dtype != torch.float8_e4m3fn)
    config = json.loads((tmp_path / "one-call" / "config.json").read_text())
    assert config["quantization_config"]["weight_block_size"] == [128, 128]
    manifest = json.loads((tmp_path / "one-call" / "lightprune_export.json").read_text())
    assert manifest["quantization"] == {"quant_method": "fp8", "weight_block_size": [128, 128],
                                        "quantized_tensors": sum(v.dtype == torch.float8_e4m3fn for v in one.values()),
                                        "stored_as": "quantized by lightprune after pruning"}
    assert manifest["mtp_layers"]["3"]["kept"] == plan.keep[3] and result.weight_bytes == manifest["weight_bytes"]
    assert not list((tmp_path / "one-call").glob(".lightprune-fp8*"))

    model = lp.load_pruned(float_dir)
    model_plan = lp.ExpertPlan(keep={i: plan.keep[i] for i in (1, 2)}, num_experts={1: 8, 2: 8})
    lp.export_pruned(model, model_plan, tmp_path / "in-memory", quantize="fp8")
    from lightprune.checkpoints import Checkpoint

    with Checkpoint(tmp_path / "in-memory") as memory, Checkpoint(tmp_path / "one-call") as streamed:
        assert memory.quantization is not None and memory.quantization.block == (128, 128)
        assert set(memory.keys()) == {k for k in streamed.keys() if not k.startswith("model.layers.3.")}
        assert all(torch.equal(memory.tensor(k), streamed.tensor(k)) for k in memory.keys())


def test_a_quantize_option_other_than_fp8_or_on_a_quantized_source_is_refused(shipped, tmp_path):
    from lightprune.callbacks import Export

    float_dir, fp8_dir = shipped
    plan = lp.select_experts(lp.score_weights(fp8_dir, "aimer", progress=False), 0.5)
    with pytest.raises(ValueError, match=r"quantize must be one of \[None, 'fp8'\], got 'int4'"):
        lp.prune_checkpoint(float_dir, plan, tmp_path / "out", quantize="int4")
    with pytest.raises(ValueError, match=r"stored quantized \(quant_method 'fp8'\): its pruned copy keeps that format"):
        lp.prune_checkpoint(fp8_dir, plan, tmp_path / "out", quantize="fp8")
    with pytest.raises(ValueError, match=r"is already quantized \(quant_method 'fp8'\)"):
        lp.quantize_checkpoint(fp8_dir, tmp_path / "out")
    with pytest.raises(ValueError, match=r"quantize must be one of \[None, 'fp8'\], got 'fp4'"):
        Export(quantize="fp4")
    assert not (tmp_path / "out").exists()


def test_a_nan_in_a_kept_fp8_expert_is_refused_naming_it_and_nothing_is_written(shipped, tmp_path):
    """float8_e4m3fn's NaN (byte 0x7F or 0xFF) in a kept expert's stored values: the streamed prune refuses it as it
    refuses a NaN in any tensor it would write, and writes nothing."""
    _, fp8_dir = shipped
    key = "model.layers.2.mlp.experts.1.up_proj.weight"

    def poison(tensors, config):
        values = tensors[key].view(torch.uint8).clone()
        values[3, 5] = 0xFF
        tensors[key] = values.view(torch.float8_e4m3fn)

    bad = _corrupted(fp8_dir, tmp_path, poison)
    plan = lp.ExpertPlan(keep={1: [0, 1, 4, 5], 2: [0, 1, 4, 5], 3: [0, 1, 4, 5]}, num_experts={1: 8, 2: 8, 3: 8})
    with pytest.raises(ValueError, match=rf"tensor '{key}' holds 1 NaN.* nothing was written"):
        lp.prune_checkpoint(bad, plan, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_an_ignore_entry_naming_one_expert_follows_it_to_its_new_number(shipped, tmp_path):
    """modules_to_not_convert naming one expert stored unquantized (layer 1's expert 5 down_proj in bf16): the pruned
    config names it under its new number, or drops it with the expert; a pattern naming experts by number is refused
    before anything is written."""
    _, fp8_dir = shipped
    key = "model.layers.1.mlp.experts.5.down_proj.weight"

    def unquantize(tensors, config):
        tensors[key] = dequantize_fp8_blocks(tensors[key], tensors.pop(key + "_scale_inv"), BLOCK, torch.bfloat16)
        config["quantization_config"]["modules_to_not_convert"] = ["lm_head", key.removesuffix(".weight")]

    mixed = _corrupted(fp8_dir, tmp_path, unquantize)
    keep = {1: [0, 1, 5, 6], 2: [0, 1, 4, 5], 3: [0, 1, 4, 5]}
    lp.prune_checkpoint(mixed, lp.ExpertPlan(keep=keep, num_experts={1: 8, 2: 8, 3: 8}), tmp_path / "kept",
                        progress=False)
    config = json.loads((tmp_path / "kept" / "config.json").read_text())
    ignored = config["quantization_config"]["modules_to_not_convert"]
    assert ignored == ["lm_head", "model.layers.1.mlp.experts.2.down_proj"]
    stored = stored_tensors(tmp_path / "kept")
    assert stored["model.layers.1.mlp.experts.2.down_proj.weight"].dtype == torch.bfloat16
    assert "model.layers.1.mlp.experts.2.down_proj.weight_scale_inv" not in stored

    keep[1] = [0, 1, 4, 6]
    lp.prune_checkpoint(mixed, lp.ExpertPlan(keep=keep, num_experts={1: 8, 2: 8, 3: 8}), tmp_path / "dropped",
                        progress=False)
    config = json.loads((tmp_path / "dropped" / "config.json").read_text())
    assert config["quantization_config"]["modules_to_not_convert"] == ["lm_head"]

    def pattern(tensors, config):
        unquantize(tensors, config)
        config["quantization_config"]["modules_to_not_convert"] = [r"model.layers.1.mlp.experts.5.down_.*"]

    bad = _corrupted(fp8_dir, tmp_path / "pattern", pattern)
    with pytest.raises(ValueError, match=r"experts by number in the pattern 'model.layers.1.mlp.experts.5.down_.\*'"):
        lp.prune_checkpoint(bad, lp.ExpertPlan(keep=keep, num_experts={1: 8, 2: 8, 3: 8}), tmp_path / "out",
                            progress=False)
    assert not (tmp_path / "out").exists()

"""Export verification's tolerance, ``max|got - ref| <= atol + rtol * max|ref|``: the rule on exact numbers, the
default ``rtol`` against its formula, and a wider Qwen3-MoE whose logits reach ~40 and routed outputs ~40-75: its
correct fp32 prune passes (though its rounding error exceeds the old absolute 1e-5) while one swapped expert is
still refused, in memory (``save_pruned`` / ``export_pruned``) and shard by shard (``prune_checkpoint``)."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

import lightprune as lp
from lightprune.experts.mask import mask_experts
from lightprune.export import MANIFEST_FILE, prune_checkpoint
from lightprune.export.verify import (
    ExportVerificationError,
    compare,
    default_atol,
    default_probe,
    default_rtol,
    model_logits,
)

U32 = 2.0 ** -24  # fp32's unit roundoff
#: hidden 256, 8 heads of 32, larger init: logits up to ~40, routed outputs ~40-75 (the experts are drawn at std 0.2)
WIDE = dict(hidden_size=256, initializer_range=0.8, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
            moe_intermediate_size=64)


def expected_rtol(u: float, k: int, layers: int) -> float:
    return math.sqrt(layers) * (2 * u + 8 * U32 * math.sqrt(k))


# ----------------------------------------------------------------------------------- the rule
def test_the_tolerance_is_atol_plus_rtol_times_the_references_largest_magnitude():
    reference = torch.tensor([[[-40.0, 1.0, 0.0], [2.0, 0.5, 0.25]]])
    atol, rtol = 2.0 ** -12, 2.0 ** -10
    tolerance = 2.0 ** -12 + 40 * 2.0 ** -10  # 0.0393..., exact in binary
    within = reference.clone()
    within[0, 0, 2] = 0.0390625  # 40 / 1024: an entry near zero may move by the tolerance (not by rtol * itself)
    got = compare(within, reference, atol, rtol)
    assert (got.max_abs_diff, got.reference_max_abs, got.atol, got.rtol) == (0.0390625, 40.0, atol, rtol)
    assert got.tolerance == tolerance and got.ok
    assert got.record() == {"max_abs_diff": 0.0390625, "reference_max_abs": 40.0, "atol": atol, "rtol": rtol,
                            "tolerance": tolerance}
    beyond = reference.clone()
    beyond[0, 1, 1] = 0.5 + 0.0400390625  # 41 / 1024 > the tolerance
    assert not compare(beyond, reference, atol, rtol).ok
    assert "0.04 > tolerance 0.0393" in compare(beyond, reference, atol, rtol).describe()

    # only the valid positions count, for the difference and for the scale
    valid = torch.tensor([[False, True]])
    masked = compare(beyond, reference, atol, rtol, valid=valid)
    assert (masked.max_abs_diff, masked.reference_max_abs) == (0.0400390625, 2.0)
    assert masked.tolerance == atol + 2 * rtol and not masked.ok

    # a non-finite reference would make any difference pass
    with pytest.raises(ExportVerificationError, match="not finite"):
        compare(reference, torch.where(reference == 1.0, torch.inf, reference), atol, rtol)


def test_default_rtol_follows_its_formula(tiny):
    model = tiny("qwen3_moe", seed=3)  # hidden 32 (the widest input), 3 decoder layers
    config = model.config
    k = max(config.hidden_size, config.moe_intermediate_size, config.num_attention_heads * config.head_dim)
    assert default_rtol(model) == pytest.approx(expected_rtol(U32, k, 3), rel=1e-12)
    assert default_rtol(model, layers=1) == pytest.approx(expected_rtol(U32, k, 1), rel=1e-12)
    half = copy.deepcopy(model).to(torch.bfloat16)
    assert default_rtol(half) == pytest.approx(expected_rtol(2.0 ** -8, k, 3), rel=1e-12)
    assert (default_atol(model), default_atol(half)) == (1e-5, 1e-2)
    # fp64 weights: compared in fp32, so fp32's roundoff
    assert default_rtol(copy.deepcopy(model).double()) == default_rtol(model)
    wide = tiny("qwen3_moe", seed=0, **WIDE)
    assert default_rtol(wide) == pytest.approx(expected_rtol(U32, 256, 3), rel=1e-12)


# ----------------------------------------------------------------------------------- a model with outputs ~40
def _half_plan(model) -> lp.ExpertPlan:
    layers = lp.find_moe_layers(model)
    return lp.ExpertPlan(keep={layer.index: list(range(0, layer.num_experts, 2)) for layer in layers},
                         num_experts={layer.index: layer.num_experts for layer in layers})


def _swap_experts(model, layer_index: int, a: int, b: int) -> None:
    """Experts ``a`` and ``b`` of a layer written under each other's index."""
    experts = next(layer for layer in lp.find_moe_layers(model) if layer.index == layer_index).experts
    with torch.no_grad():
        for weight in (experts.gate_up_proj, experts.down_proj):
            weight[[a, b]] = weight[[b, a]].clone()


def _exact_masked_logits(model, plan, probe) -> torch.Tensor:
    """The masked model's logits computed in fp64 (transformers' eager experts), rounded to fp32 once."""
    exact = copy.deepcopy(model).double()
    exact.set_experts_implementation("eager")
    with mask_experts(exact, plan):
        return model_logits(exact, probe)


def test_a_correct_fp32_prune_with_outputs_near_40_passes_and_a_swapped_expert_fails(tiny, tmp_path):
    model = tiny("qwen3_moe", seed=0, **WIDE)
    plan = _half_plan(model)
    probe = default_probe(model)
    exact = _exact_masked_logits(model, plan, probe)
    scale = float(exact.abs().max())
    assert 35 < scale < 50
    lp.prune_experts(model, plan)
    error = float((model_logits(model, probe) - exact).abs().max())  # fp32's own rounding error at this scale
    assert error > 1e-5  # what the absolute 1e-5 refused

    out = lp.save_pruned(model, tmp_path / "ok", probe=probe, reference_logits=exact, atol=1e-6).path
    verification = json.loads((out / MANIFEST_FILE).read_text())["verification"]
    rtol = expected_rtol(U32, 256, 3)
    assert verification["max_abs_diff"] == pytest.approx(error, rel=1e-6)
    assert verification["reference_max_abs"] == scale
    assert verification["atol"] == 1e-6  # the atol given is the absolute term
    assert verification["rtol"] == pytest.approx(rtol, rel=1e-12)
    assert verification["tolerance"] == pytest.approx(1e-6 + rtol * scale, rel=1e-12)
    assert verification["max_abs_diff"] < verification["tolerance"]

    _swap_experts(model, 1, 0, 1)
    swapped = float((model_logits(model, probe) - exact).abs().max())
    with pytest.raises(ExportVerificationError, match="differ from the reference") as err:
        lp.save_pruned(model, tmp_path / "swapped", probe=probe, reference_logits=exact)
    assert err.value.max_abs_diff == pytest.approx(swapped, rel=1e-6)
    assert err.value.tolerance == pytest.approx(1e-5 + rtol * scale, rel=1e-12)
    assert swapped > 100 * err.value.tolerance
    assert not (tmp_path / "swapped").exists()


def test_export_pruned_of_the_wider_model_passes_and_names_a_swapped_expert(tiny, tmp_path, monkeypatch):
    """The reference through transformers' batched experts kernel, the reloaded checkpoint through its default one:
    the same function, rounded differently."""
    from lightprune.export import pipeline

    model = tiny("qwen3_moe", seed=0, **WIDE)
    model.set_experts_implementation("batched_mm")
    plan = _half_plan(model)
    probe = default_probe(model)
    with mask_experts(model, plan):
        reference = model_logits(model, probe)
    result = lp.export_pruned(model, plan, tmp_path / "ok")
    reloaded = model_logits(lp.load_pruned(result.path), probe)
    verification = result.verification
    assert verification["max_abs_diff"] == float((reloaded - reference).abs().max())
    assert verification["reference_max_abs"] == float(reference.abs().max()) > 35
    assert verification["tolerance"] == pytest.approx(1e-5 + expected_rtol(U32, 256, 3) * float(reference.abs().max()))

    real_prune = pipeline.prune_experts

    def swapping_prune(model, plan, **checked):
        real_prune(model, plan, **checked)
        _swap_experts(model, 1, 0, 1)
        return model

    monkeypatch.setattr(pipeline, "prune_experts", swapping_prune)
    with pytest.raises(ExportVerificationError, match="pruned model's logits differ from the masked") as err:
        lp.export_pruned(tiny("qwen3_moe", seed=0, **WIDE), plan, tmp_path / "swapped")
    assert err.value.max_abs_diff > 100 * err.value.tolerance
    assert not (tmp_path / "swapped").exists()


def test_prune_checkpoint_of_the_wider_model_records_each_check_and_refuses_a_swapped_expert(tiny, tmp_path,
                                                                                            monkeypatch):
    import lightprune.export.streamed as streamed

    model = tiny("qwen3_moe", seed=0, **WIDE)
    model.save_pretrained(tmp_path / "src")
    plan = _half_plan(model)
    routed: dict[int, float] = {}  # the masked source's routed outputs: each layer check's reference
    hooks = [layer.experts.register_forward_hook(
        lambda module, args, out, index=layer.index: routed.__setitem__(index, float(out.abs().max())))
        for layer in lp.find_moe_layers(model)]
    with mask_experts(model, plan):
        reference = model_logits(model, default_probe(model))
    for hook in hooks:
        hook.remove()
    assert min(routed.values()) > 35

    verification = prune_checkpoint(tmp_path / "src", plan, tmp_path / "ok", progress=False).verification
    layer_rtol = expected_rtol(U32, 256, 1)
    assert verification["logits"]["reference_max_abs"] == pytest.approx(float(reference.abs().max()), rel=1e-6)
    assert verification["logits"]["rtol"] == pytest.approx(expected_rtol(U32, 256, 3), rel=1e-12)
    assert set(verification["blocks"]) == {"0", "1", "2"}
    for index, block in verification["blocks"].items():
        assert block["reference_max_abs"] == pytest.approx(routed[int(index)], rel=1e-6)
        assert block["rtol"] == pytest.approx(layer_rtol, rel=1e-12)
        assert block["tolerance"] == pytest.approx(1e-5 + layer_rtol * block["reference_max_abs"], rel=1e-12)
        assert block["max_abs_diff"] <= block["tolerance"]

    rules = streamed.key_rules

    def swapped(*args):  # kept experts 0 and 1 of layer 1 written under each other's index
        found = rules(*args)
        for key, rule in found.items():
            if rule.out_key and ".layers.1.mlp.experts." in rule.out_key:
                if ".experts.0." in rule.out_key:
                    found[key] = streamed.KeyRule(rule.out_key.replace(".experts.0.", ".experts.1."))
                elif ".experts.1." in rule.out_key:
                    found[key] = streamed.KeyRule(rule.out_key.replace(".experts.1.", ".experts.0."))
        return found

    monkeypatch.setattr(streamed, "key_rules", swapped)
    with pytest.raises(ExportVerificationError, match="layer 1") as err:
        prune_checkpoint(tmp_path / "src", plan, tmp_path / "swapped", progress=False)
    assert err.value.max_abs_diff > 100 * err.value.tolerance
    assert not (tmp_path / "swapped").exists()


def test_the_model_card_states_the_tolerance_the_check_applied(tiny, tmp_path):
    """README.md's verification line gives the tolerance recorded in the manifest (atol + rtol x the reference's
    largest magnitude), for an in-memory and a shard-by-shard export alike."""
    import re

    model = tiny("qwen3_moe", seed=0)
    model.save_pretrained(tmp_path / "src")
    plan = lp.select_experts(lp.score_weights(model, "random", seed=1), ratio=0.5)
    exported = lp.export_pruned(model, plan, tmp_path / "memory")
    streamed = lp.prune_checkpoint(tmp_path / "src", plan, tmp_path / "streamed", progress=False)
    for out, record in ((exported, exported.manifest["verification"]),
                        (streamed, streamed.manifest["verification"]["logits"])):
        card = (out.path / "README.md").read_text()
        line = next(line for line in card.splitlines() if "tolerance" in line)
        shown = [float(x) for x in re.findall(r"tolerance ([0-9.e+-]+) = atol ([0-9.e+-]+) \+ rtol ([0-9.e+-]+) x the "
                                              r"reference's largest magnitude ([0-9.e+-]+)", line)[0]]
        assert record == json.loads((out.path / MANIFEST_FILE).read_text())["verification"].get("logits", record)
        expected = [record["tolerance"], record["atol"], record["rtol"], record["reference_max_abs"]]
        assert shown == pytest.approx(expected, rel=1e-3), (line, expected)
        assert record["tolerance"] == pytest.approx(record["atol"] + record["rtol"] * record["reference_max_abs"])

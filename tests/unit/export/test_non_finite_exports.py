"""An export never writes a NaN or inf: a tensor it would write that holds one is refused naming it (and the expert)
before anything is published, in memory (``save_pruned`` / ``export_pruned``) and shard by shard
(``prune_checkpoint``, per tensor as it is written); a NaN in an expert the plan prunes is not written, so not
refused. A model whose own logits are NaN on the verification probe (a config value such as ``rope_theta: -1``, its
weights finite) is named as the culprit, not the export: before any pruning in memory, by the streamed verification's
look at the source's own forward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import lightprune as lp
from lightprune.export import ExportVerificationError
from lightprune.export.verification import non_finite_tensors

#: keep experts 0..3 of every layer of a tiny Qwen3-MoE (3 layers of 8)
KEEP = {layer: [0, 1, 2, 3] for layer in range(3)}


def _plan(keep: dict[int, list[int]] = KEEP) -> lp.ExpertPlan:
    return lp.ExpertPlan(keep=keep, num_experts={layer: 8 for layer in keep})


def _nan_in_expert(model, layer: int = 2, expert: int = 1, value: float = float("nan")):
    model.model.layers[layer].mlp.experts.down_proj.data[expert, 0, 0] = value
    return model


def _counts(model) -> list[int]:
    return [layer.num_experts for layer in lp.find_moe_layers(model)]


def test_export_pruned_names_a_nan_in_a_kept_expert_before_any_pruning(tiny, tmp_path):
    model = _nan_in_expert(tiny("qwen3_moe"))
    with pytest.raises(ExportVerificationError) as raised:
        lp.export_pruned(model, _plan(), tmp_path / "out")
    assert str(raised.value).startswith(
        "export_pruned: the model's own logits on the verification probe (before any pruning, the plan's experts "
        "masked) hold ")
    assert "its tensor model.layers.2.mlp.experts.down_proj (expert 1) holds 1 NaN (first at [0, 0])" in \
        str(raised.value)
    assert str(raised.value).endswith("nothing was pruned or written")
    assert _counts(model) == [8, 8, 8] and list(tmp_path.iterdir()) == []


def test_save_pruned_refuses_a_non_finite_tensor_it_would_write_naming_it(tiny, tmp_path):
    model = lp.prune_experts(tiny("qwen3_moe"), _plan())
    model.model.layers[0].mlp.experts.gate_up_proj.data[2, 1, 1] = float("inf")
    model.model.norm.weight.data[3] = float("nan")
    with pytest.raises(ValueError) as raised:
        lp.save_pruned(model, tmp_path / "out")
    assert str(raised.value) == ("save_pruned: tensor model.layers.0.mlp.experts.gate_up_proj (expert 2) holds 1 inf "
                                 "(first at [1, 1]) (and 1 more): the export would carry it (a broken weight); nothing "
                                 "was written; restore the weights, or prune the expert that holds it")
    assert list(tmp_path.iterdir()) == []


def test_export_pruned_names_a_non_finite_kept_expert_by_its_id_before_pruning(tiny, tmp_path):
    """Expert 5 of layer 2 (8 experts, keep [0, 2, 5, 7]) holds a NaN but is never routed (its correction bias -100
    against sigmoid scores in (0, 1)), so the masked logits are finite and the written tensors are checked after the
    pruning, where it sits at position 2: it is named expert 5, as the plan names it, by export_pruned."""
    model = tiny("deepseek_v3")
    keep = {layer.index: [0, 2, 5, 7] for layer in lp.find_moe_layers(model)}
    plan = lp.ExpertPlan(keep=keep, num_experts={layer: 8 for layer in keep})
    model.model.layers[2].mlp.gate.e_score_correction_bias.data[5] = -100.0
    model.model.layers[2].mlp.experts.down_proj.data[5, 0, 1] = float("nan")
    with pytest.raises(ValueError) as raised:
        lp.export_pruned(model, plan, tmp_path / "out")
    assert str(raised.value) == ("export_pruned: tensor model.layers.2.mlp.experts.down_proj (expert 5) holds 1 NaN "
                                 "(first at [0, 1]): the export would carry it (a broken weight); nothing was "
                                 "written; restore the weights, or prune the expert that holds it")
    assert _counts(model) == [4, 4] and list(tmp_path.iterdir()) == []
    assert torch.isnan(model.model.layers[2].mlp.experts.down_proj[2, 0, 1])  # position 2 in the pruned tensor
    assert non_finite_tensors(model) == [  # without the plan's ids: the position
        "model.layers.2.mlp.experts.down_proj (expert 2) holds 1 NaN (first at [0, 1])"]


def test_prune_checkpoint_refuses_a_non_finite_tensor_as_it_writes_it(tiny, tmp_path):
    _nan_in_expert(tiny("qwen3_moe")).save_pretrained(tmp_path / "ckpt")
    with pytest.raises(ValueError) as raised:
        lp.prune_checkpoint(tmp_path / "ckpt", _plan(), tmp_path / "out", progress=False)
    assert str(raised.value) == (f"prune_checkpoint of {str(tmp_path / 'ckpt')!r}: tensor "
                                 "'model.layers.2.mlp.experts.1.down_proj.weight' holds 1 NaN (first at [0, 0]): the "
                                 "export would carry it (a broken weight); nothing was written; restore the weights, "
                                 "or prune the expert that holds it")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_prune_checkpoint_names_the_expert_of_a_fused_tensor_on_disk(tiny, tmp_path):
    model = tiny("gpt_oss")
    model.model.layers[0].mlp.experts.gate_up_proj.data[1, 0, 0] = float("nan")
    model.save_pretrained(tmp_path / "ckpt")
    counts = {layer.index: layer.num_experts for layer in lp.find_moe_layers(model)}
    plan = lp.ExpertPlan(keep={layer: list(range(1, count)) for layer, count in counts.items()}, num_experts=counts)
    with pytest.raises(ValueError, match=r"tensor 'model.layers.0.mlp.experts.gate_up_proj' \(expert 1\) holds 1 NaN "
                                         r"\(first at \[0, 0\]\): the export would carry it"):
        lp.prune_checkpoint(tmp_path / "ckpt", plan, tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_a_nan_in_an_expert_the_plan_prunes_is_not_written_so_not_refused(tiny, tmp_path):
    plan = _plan({layer: [0, 2, 3, 4] for layer in range(3)})
    _nan_in_expert(tiny("qwen3_moe")).save_pretrained(tmp_path / "ckpt")
    lp.prune_checkpoint(tmp_path / "ckpt", plan, tmp_path / "streamed", progress=False)
    lp.export_pruned(_nan_in_expert(tiny("qwen3_moe")), plan, tmp_path / "in-memory")
    assert (tmp_path / "streamed" / "model.safetensors").is_file()
    assert (tmp_path / "in-memory" / "model.safetensors").is_file()


@pytest.fixture
def rope_theta_negative(tiny, tmp_path) -> Path:
    """A tiny Qwen3-MoE checkpoint whose config says ``rope_theta: -1`` (finite weights, NaN rotary tables)."""
    path = tmp_path / "ckpt"
    tiny("qwen3_moe").save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config["rope_parameters"]["rope_theta"] = -1.0
    (path / "config.json").write_text(json.dumps(config))
    return path


_BROKEN = "the model itself is broken, not the export (a config value such as rope_theta or rms_norm_eps, or a NaN " \
    "weight)"


def test_a_source_whose_own_logits_are_nan_is_named_not_the_export_in_memory(rope_theta_negative, tmp_path):
    model = lp.load_pruned(rope_theta_negative)
    with pytest.raises(ExportVerificationError) as raised:
        lp.export_pruned(model, _plan(), tmp_path / "out")
    message = str(raised.value)
    assert message.startswith("export_pruned: the model's own logits on the verification probe (before any pruning, "
                              "the plan's experts masked) hold ")
    assert message.endswith(f" NaN (first at [0, 0, 0]), its weights are finite: {_BROKEN}; nothing was pruned or "
                            "written")
    assert _counts(model) == [8, 8, 8] and not (tmp_path / "out").exists()
    pruned = lp.prune_experts(model, _plan())
    with pytest.raises(ExportVerificationError, match=r"^save_pruned: the model's own logits on the verification "
                                                      r"probe \(the model to be written\) hold .* its weights are "
                                                      r"finite: the model itself is broken, not the export"):
        lp.save_pruned(pruned, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_source_whose_own_forward_is_nan_is_named_not_the_export_streamed(rope_theta_negative, tmp_path):
    with pytest.raises(ExportVerificationError) as raised:
        lp.prune_checkpoint(rope_theta_negative, _plan(), tmp_path / "out", progress=False)
    message = str(raised.value)
    assert message.startswith("the source checkpoint's own forward on the verification probe (before pruning, the "
                              "plan's experts masked) gives ")
    assert message.endswith(f" NaN (first at [0, 0]) in layer 0's (model.layers.0.mlp) MoE input: {_BROKEN}; nothing "
                            "was written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]

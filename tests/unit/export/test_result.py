"""The result of an export (:mod:`lightprune.export.result`): its attributes are the manifest's figures and agree with
independent counts (the reloaded model's parameters, the safetensors files' bytes and tensors); it is a path-like
of the checkpoint, and neither a ``Path`` nor a dict."""

from __future__ import annotations

import copy
import json
import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import lightprune as lp
from lightprune.export import MANIFEST_FILE, ExportResult, prune_checkpoint
from lightprune.export.verify import ExportVerificationError, max_abs_diff


def _plan(model, partial: bool = False) -> lp.ExpertPlan:
    """Layer 0 keeps 4 of its 8 experts, the others keep all theirs (``partial``: they are left out of the plan, then
    kept whole by ``completed``, the explicit way)."""
    layers = lp.find_moe_layers(model)[:1] if partial else lp.find_moe_layers(model)
    if partial:
        return lp.ExpertPlan(keep={0: [1, 3, 4, 6]}, num_experts={0: layers[0].num_experts}).completed(
            lp.find_moe_layers(model))
    return lp.ExpertPlan(keep={layer.index: [1, 3, 4, 6] if layer.index == 0 else list(range(layer.num_experts))
                               for layer in layers}, num_experts={layer.index: layer.num_experts for layer in layers})


def _safetensors(path: Path) -> tuple[int, int]:
    """(bytes of the files, bytes of the tensors they hold)."""
    files = sorted(path.glob("*.safetensors"))
    tensors = 0
    for file in files:
        with safe_open(file, "pt") as f:
            tensors += sum(f.get_tensor(k).nbytes for k in f.keys())
    return sum(f.stat().st_size for f in files), tensors


def _parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def exported(tiny, tmp_path_factory):
    """(the result of export_pruned, the plan, the unpruned model's parameter count)."""
    model = tiny("qwen3_moe")
    before = _parameters(model)
    plan = _plan(model)
    result = lp.export_pruned(model, plan, tmp_path_factory.mktemp("result") / "ckpt")
    return result, plan, before


# ----------------------------------------------------------------------------------- the plain API
def test_export_pruned_result_equals_its_manifest_and_independent_counts(exported):
    result, plan, before = exported
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the plain API never warns
        manifest = json.loads((result.path / MANIFEST_FILE).read_text())
        assert result.manifest == manifest
        reloaded = lp.load_pruned(result)  # os.PathLike
        counts = {layer.index: layer.num_experts for layer in lp.find_moe_layers(reloaded)}
        assert result.experts_per_layer == counts == {0: 4, 1: 8, 2: 8}
        assert result.experts_per_layer == {int(k): v for k, v in manifest["experts_per_layer"].items()}
        assert not result.uniform and manifest["uniform"] is False
        assert result.parameters == manifest["parameters"] == _parameters(reloaded)
        assert result.parameters_before == manifest["parameters_before"] == before > result.parameters
        assert result.parameter_bytes_before == manifest["parameter_bytes_before"] > result.parameter_bytes
        file_bytes, tensor_bytes = _safetensors(result.path)
        assert result.weight_bytes == manifest["weight_bytes"] == file_bytes
        assert result.parameter_bytes == manifest["parameter_bytes"] == tensor_bytes
        assert result.weight_bytes_before is None  # built in memory: no source files
        assert result.verification == manifest["verification"]
        assert result.max_abs_diff == manifest["verification"]["max_abs_diff"] <= 1e-5
        assert result.seconds > 0
        assert isinstance(result, os.PathLike) and not isinstance(result, Path)
        assert os.fspath(result) == str(result) == str(result.path) and result.path.is_absolute()
        assert Path(result) == result.path and f"{result}" == str(result.path)
        assert "manifest" not in repr(result) and "experts_per_layer={0: 4, 1: 8, 2: 8}" in repr(result)


def test_save_pruned_and_prune_checkpoint_return_the_same_kind_of_result(tiny, tmp_path):
    model = tiny("qwen3_moe", seed=1)
    model.save_pretrained(tmp_path / "src")
    before, plan = _parameters(model), _plan(model, partial=True)  # prune_checkpoint: the others keep all
    lp.prune_experts(model, plan)
    saved = lp.save_pruned(model, tmp_path / "saved", source_dir=tmp_path / "src")
    assert isinstance(saved, ExportResult) and saved.path == (tmp_path / "saved").absolute()
    assert saved.manifest == json.loads((saved.path / MANIFEST_FILE).read_text())
    assert saved.parameters_before is None and saved.parameters == _parameters(model)  # no card: not known
    source_bytes, _ = _safetensors(tmp_path / "src")
    assert saved.weight_bytes_before == source_bytes

    streamed = prune_checkpoint(tmp_path / "src", plan, tmp_path / "streamed", progress=False)
    assert isinstance(streamed, ExportResult)
    assert streamed.manifest == json.loads((streamed.path / MANIFEST_FILE).read_text())
    assert streamed.experts_per_layer == saved.experts_per_layer and streamed.parameters == saved.parameters
    assert streamed.parameters_before == before and streamed.weight_bytes_before == source_bytes
    file_bytes, tensor_bytes = _safetensors(streamed.path)
    assert (streamed.weight_bytes, streamed.parameter_bytes) == (file_bytes, tensor_bytes)
    assert streamed.verification["blocks"].keys() == {"0", "1", "2"} and streamed.max_abs_diff <= 1e-5

    unverified = prune_checkpoint(tmp_path / "src", plan, tmp_path / "quick", verify=False, progress=False)
    assert unverified.verification is None and unverified.max_abs_diff is None


def test_a_completed_partial_plan_exports_as_the_whole_plan_in_both_exports(tiny, tmp_path):
    """A plan naming some layers is refused by every entry point (tests/unit/experts/test_plan_entry_points.py);
    completed (ExpertPlan.completed), the layers it left out keep every expert, in export_pruned and
    prune_checkpoint alike, and the checkpoint equals the one exported with the whole plan."""
    model = tiny("qwen3_moe")
    with pytest.raises(lp.PlanError, match=r"plan leaves out MoE layers \[1, 2\]"):
        lp.export_pruned(copy.deepcopy(model), lp.ExpertPlan(keep={0: [1, 3, 4, 6]}, num_experts={0: 8}),
                         tmp_path / "refused")
    partial = lp.export_pruned(copy.deepcopy(model), _plan(model, partial=True), tmp_path / "partial")
    whole = lp.export_pruned(copy.deepcopy(model), _plan(model), tmp_path / "whole")
    assert partial.experts_per_layer == whole.experts_per_layer == {0: 4, 1: 8, 2: 8}
    assert partial.manifest["plan"]["keep"] == whole.manifest["plan"]["keep"]
    a, b = lp.load_pruned(partial).state_dict(), lp.load_pruned(whole).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    model.save_pretrained(tmp_path / "src")
    streamed = prune_checkpoint(tmp_path / "src", _plan(model, partial=True), tmp_path / "streamed", progress=False)
    assert streamed.experts_per_layer == whole.experts_per_layer
    assert streamed.manifest["plan"]["keep"] == whole.manifest["plan"]["keep"]


# ----------------------------------------------------------------------------------- only a path-like
def test_the_result_is_no_path_and_no_dict(exported):
    """Beyond ``os.PathLike`` and ``str``, what a path or a dict offers is refused, naming what was asked for."""
    result = exported[0]
    with pytest.raises(TypeError, match="unsupported operand type"):
        _ = result / MANIFEST_FILE
    with pytest.raises(AttributeError, match="'ExportResult' object has no attribute 'exists'"):
        result.exists()
    with pytest.raises(TypeError, match="'ExportResult' object is not subscriptable"):
        _ = result["params_after"]
    with pytest.raises(TypeError):
        iter(result)
    assert result != result.path and result.path / MANIFEST_FILE == Path(result) / MANIFEST_FILE
    assert hash(result) == hash(result.path)
    copy = pickle.loads(pickle.dumps(result))
    assert copy == result and copy.manifest == result.manifest


def test_the_manifest_has_one_name():
    import lightprune.export.width as width
    import lightprune.export.width_format as width_format

    assert width.MANIFEST_FILE is MANIFEST_FILE == "lightprune_export.json"
    with pytest.raises(AttributeError, match="has no attribute 'MANIFEST_NAME'"):
        _ = width_format.MANIFEST_NAME


# ----------------------------------------------------------------------------------- one comparison
def test_max_abs_diff_counts_only_the_valid_positions():
    reference = torch.zeros(2, 3, 4)
    logits = reference.clone()
    logits[1, 2] = float("nan")  # a padding position: no query there
    logits[0, 1, 3] = 0.25
    valid = torch.tensor([[True, True, True], [True, True, False]])
    assert max_abs_diff(logits, reference, valid=valid) == 0.25
    with pytest.raises(ExportVerificationError, match="NaN"):
        max_abs_diff(logits, reference)
    with pytest.raises(ValueError, match="valid must be a boolean mask"):
        max_abs_diff(logits, reference, valid=valid[:, :2])
    with pytest.raises(ExportVerificationError, match="do not match the reference"):
        max_abs_diff(logits[:, :2], reference, valid=valid)


def test_record_evaluation_rewrites_a_width_manifest_and_writes_no_card(tmp_path) -> None:
    from lightprune.export.result import MANIFEST_FILE, WIDTH_FORMAT, record_evaluation

    manifest = {"format": WIDTH_FORMAT, "format_version": 1, "pruned_fractions": {"v2v": 0.5},
                "evaluation": {"before": {"perplexity": 9.0}}}
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(manifest))
    evaluation = {"split": "val", "before": {"perplexity": 9.0}, "after": {"perplexity": 11.5}}
    record_evaluation(tmp_path, evaluation)
    assert json.loads((tmp_path / MANIFEST_FILE).read_text()) == {**manifest, "evaluation": evaluation}
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST_FILE]  # no card, nothing staged left
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ValueError, match="'something-else'"):
        record_evaluation(tmp_path, evaluation)

"""One verification for every export, each step of it once per export: the plan checked against the model
(``ExpertPlan.check_layers``), ``atol`` checked (``check_atol``), the probe built (``default_probe``) and, in memory,
the fp32 buffers restored (``restore_fp32_buffers``), counted over every module of lightprune that holds them, for an
in-memory export (``export_pruned``, ``save_pruned``, ``save_width_pruned``) and a streamed one
(``prune_checkpoint``); and the shared verification still refuses a checkpoint written wrong."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable

import pytest
import torch

import lightprune as lp
from lightprune.core.checks import check_atol
from lightprune.experts.plan import ExpertPlan
from lightprune.export.verify import ExportVerificationError, default_probe, restore_fp32_buffers

STEPS = (check_atol, default_probe, restore_fp32_buffers)


def _spy_everywhere(monkeypatch: pytest.MonkeyPatch, function: Callable, calls: Counter) -> None:
    """Count ``function``'s calls through every lightprune module that imported it."""
    def spy(*args, **kwargs):
        calls[function.__name__] += 1
        return function(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.startswith("lightprune") and getattr(module, function.__name__, None) is function:
            monkeypatch.setattr(module, function.__name__, spy)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter:
    import lightprune.export  # noqa: F401 - every export module loaded, so each import of a step is spied on

    found: Counter = Counter()
    for function in STEPS:
        _spy_everywhere(monkeypatch, function, found)
    check_layers = ExpertPlan.check_layers

    def counted(plan, layers):
        found["check_layers"] += 1
        return check_layers(plan, layers)

    monkeypatch.setattr(ExpertPlan, "check_layers", counted)
    return found


def _half_plan(model) -> lp.ExpertPlan:
    layers = lp.find_moe_layers(model)
    return lp.ExpertPlan(keep={layer.index: list(range(0, layer.num_experts, 2)) for layer in layers},
                         num_experts={layer.index: layer.num_experts for layer in layers})


def test_export_pruned_runs_each_step_once(tiny, tmp_path, calls):
    model = tiny("qwen3_moe", seed=0)
    result = lp.export_pruned(model, _half_plan(model), tmp_path / "out", atol=1e-4)
    assert result.verification["atol"] == 1e-4
    assert calls == {"check_layers": 1, "check_atol": 1, "default_probe": 1, "restore_fp32_buffers": 1}


def test_export_pruned_of_a_non_uniform_plan_runs_each_step_once(tiny, tmp_path, calls):
    """Two reloads (``load_pruned`` and ``trust_remote_code``), one probe, one ``atol``."""
    model = tiny("qwen3_moe", seed=0)
    layers = lp.find_moe_layers(model)
    plan = lp.ExpertPlan(keep={layer.index: list(range(layer.num_experts - layer.index - 2))
                               for layer in layers}, num_experts={layer.index: layer.num_experts for layer in layers})
    result = lp.export_pruned(model, plan, tmp_path / "out")
    assert set(result.verification["loaders"]) == {"load_pruned", "trust_remote_code"}
    assert calls == {"check_layers": 1, "check_atol": 1, "default_probe": 1, "restore_fp32_buffers": 1}


def test_export_pruned_of_a_merge_plan_runs_each_step_once(tiny, tmp_path, calls):
    """A MergePlan: checked once (as the ExpertPlan of its kept layout), before the irreversible merge."""
    model = tiny("qwen3_moe", seed=0)
    layers = lp.find_moe_layers(model)
    n = layers[0].num_experts
    indices = [layer.index for layer in layers]
    merge = lp.MergePlan(clusters={i: [[e, e + 1] for e in range(0, n, 2)] for i in indices},
                         dominant={i: list(range(0, n, 2)) for i in indices},
                         coefficients={i: [[0.5, 0.5]] * (n // 2) for i in indices},
                         num_experts={i: n for i in indices})
    lp.export_pruned(model, merge, tmp_path / "out")
    assert calls == {"check_layers": 1, "check_atol": 1, "default_probe": 1, "restore_fp32_buffers": 1}


def test_save_pruned_runs_each_step_once(tiny, tmp_path, calls):
    model = lp.prune_experts(tiny("qwen3_moe", seed=0), _half_plan(tiny("qwen3_moe", seed=0)))
    calls.clear()
    lp.save_pruned(model, tmp_path / "out")
    assert calls == {"check_atol": 1, "default_probe": 1, "restore_fp32_buffers": 1}


def test_prune_checkpoint_runs_each_step_once(tiny, tmp_path, calls):
    """The streamed export reads the checkpoint as stored (its buffers as the checkpoint's model builds them):
    nothing to restore."""
    model = tiny("qwen3_moe", seed=0)
    model.save_pretrained(tmp_path / "src")
    plan = _half_plan(model)
    result = lp.prune_checkpoint(tmp_path / "src", plan, tmp_path / "out", atol=1e-4, progress=False)
    assert result.verification["atol"] == 1e-4
    assert calls == {"check_layers": 1, "check_atol": 1, "default_probe": 1}


def test_save_width_pruned_runs_each_step_once(tiny, tmp_path, calls):
    from lightprune.width.plan import WidthPlan

    model = tiny("qwen2_5_vl")
    dense = WidthPlan.dense(model)
    plan = dense.replace(attn_keep={layer: keep.clone().fill_(True) for layer, keep in dense.attn_keep.items()})
    lp.save_width_pruned(model, plan, tmp_path / "out", align=16)
    assert calls == {"check_atol": 1, "default_probe": 1, "restore_fp32_buffers": 1}


def test_the_shared_verification_refuses_a_corrupted_checkpoint_in_memory_and_streamed(tiny, tmp_path, monkeypatch):
    """A weight changed between the save and the reload: both exports refuse it and write nothing."""
    import lightprune.export.streamed as streamed
    from lightprune.export import verification

    model = tiny("qwen3_moe", seed=0)
    model.save_pretrained(tmp_path / "src")
    plan = _half_plan(model)
    real = verification.load_pruned

    def corrupted(path, **kwargs):
        reloaded = real(path, **kwargs)
        with torch.no_grad():
            lp.find_moe_layers(reloaded)[0].experts.down_proj.mul_(1.5)
        return reloaded

    monkeypatch.setattr(verification, "load_pruned", corrupted)
    with pytest.raises(ExportVerificationError, match="checkpoint reloaded with load_pruned gives logits that differ"):
        lp.export_pruned(model, plan, tmp_path / "memory")
    assert not (tmp_path / "memory").exists()

    write_shard = streamed._write_shard

    def scaled(checkpoint, file, rules, out):
        sizes = write_shard(checkpoint, file, rules, out)
        from safetensors.torch import load_file, save_file

        tensors = load_file(out / file.name)
        name = next(key for key in tensors if ".layers.0.mlp.experts.0.down_proj" in key)
        tensors[name] = tensors[name] * 1.5
        save_file(tensors, out / file.name, metadata={"format": "pt"})
        return sizes

    monkeypatch.setattr(streamed, "_write_shard", scaled)
    with pytest.raises(ExportVerificationError, match="layer 0"):
        lp.prune_checkpoint(tmp_path / "src", plan, tmp_path / "streamed", progress=False)
    assert not (tmp_path / "streamed").exists()

"""Export: save -> reload -> the same logits as the masked model, for every family.

Uniform plans reload with plain transformers ``from_pretrained``; non-uniform plans (global
allocation, or a hand-made plan with a layer left at exactly its floor) reload with
``lp.load_pruned`` and with transformers' ``trust_remote_code=True`` through the generated
``modeling_lightprune.py``. Failures leave nothing behind: a verification mismatch, an existing
output directory; broken checkpoints fail to load with errors that name them; and
``load_pruned`` never executes the checkpoint's code.
"""

from __future__ import annotations

import ast
import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from fixtures import DEEPSEEK_LIKE, config_count

import lightprune as lp
from lightprune.checkpoints.classes import auto_class_name
from lightprune.experts.scores import ExpertScores
from lightprune.export import MANIFEST_FILE, default_probe
from lightprune.export.remote_code import MODELING_FILE
from lightprune.export.verify import model_logits, special_token_ids
from lightprune.models import FAMILIES
from lightprune.testing.tiny import TINY_FAMILIES, tiny_model

PER_LAYER_KEY = "lightprune_experts_per_layer"
ATOL = 1e-5
_MODELS: dict[str, torch.nn.Module] = {}


REMOTE = "lpx_remote_ckpt"  # checkpoints loaded with trust_remote_code: transformers caches their code by name


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True, scope="module")
def _forget_remote_code():
    yield
    from transformers.dynamic_module_utils import HF_MODULES_CACHE, TRANSFORMERS_DYNAMIC_MODULE_NAME

    shutil.rmtree(Path(HF_MODULES_CACHE) / TRANSFORMERS_DYNAMIC_MODULE_NAME / REMOTE, ignore_errors=True)


def fresh(family: str) -> torch.nn.Module:
    """A deep copy of a cached tiny model (built once per family)."""
    if family not in _MODELS:
        _MODELS[family] = tiny_model(family, seed=3)
    return copy.deepcopy(_MODELS[family])


def scored_plan(model, ratio: float, allocation: str, seed: int = 0) -> lp.ExpertPlan:
    layers = lp.find_moe_layers(model)
    gen = torch.Generator().manual_seed(seed)
    scores = ExpertScores({layer.index: torch.rand(layer.num_experts, generator=gen) for layer in layers},
                          ExpertScores.limits_of(layers))
    return lp.select_experts(scores, ratio, allocation)


def floor_plan(model) -> lp.ExpertPlan:
    """First MoE layer keeps exactly its floor (top-k, or 2 per group), the last keeps all, others 5."""
    layers = lp.find_moe_layers(model)
    keep = {}
    for i, layer in enumerate(layers):
        count = layer.min_experts if i == 0 else layer.num_experts if i == len(layers) - 1 else 5
        if layer.n_group > 1:
            size, per = layer.num_experts // layer.n_group, count // layer.n_group
            keep[layer.index] = [g * size + size - 1 - q for g in range(layer.n_group) for q in range(per)]
        else:
            keep[layer.index] = list(range(layer.num_experts - 1, layer.num_experts - 1 - count, -1))
    return lp.ExpertPlan(keep=keep, num_experts={layer.index: layer.num_experts for layer in layers})


def masked_logits(model, plan, probe):
    with lp.mask_experts(model, plan):
        return model_logits(model, probe)


def auto_load(path, model_type, **kwargs):
    import transformers

    cls = getattr(transformers, auto_class_name(type("C", (), {"model_type": model_type})()))
    return cls.from_pretrained(path, **kwargs).eval()


def counts_of(model) -> dict[int, int]:
    return {layer.index: layer.num_experts for layer in lp.find_moe_layers(model)}


def assert_only_safetensors(path: Path) -> None:
    names = sorted(p.name for p in path.rglob("*") if p.is_file())
    assert any(n.endswith(".safetensors") for n in names), names
    assert not [n for n in names if n.endswith((".bin", ".pt", ".pth", ".ckpt", ".pkl"))], names


def assert_clean_parent(parent: Path, expected: set[str]) -> None:
    """No staging / set-aside directories left beside the output."""
    assert {p.name for p in parent.iterdir()} == expected


# ----------------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("kind", ["global", "floor"])
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_non_uniform_export_reloads_with_both_loaders(tmp_path, family, kind):
    model = fresh(family)
    plan = scored_plan(model, 0.5, "global") if kind == "global" else floor_plan(model)
    probe = default_probe(model)
    reference = masked_logits(model, plan, probe)
    out = tmp_path / REMOTE
    result = lp.export_pruned(model, plan, out)

    assert result.path == out.absolute() and result.max_abs_diff <= ATOL
    assert result.experts_per_layer == plan.kept_counts() and result.uniform == plan.is_uniform
    assert result.parameters < result.parameters_before
    assert_only_safetensors(out)
    assert_clean_parent(tmp_path, {REMOTE})

    reloaded = lp.load_pruned(out)
    assert counts_of(reloaded) == plan.kept_counts()
    torch.testing.assert_close(model_logits(reloaded, probe), reference, atol=ATOL, rtol=0)

    config = json.loads((out / "config.json").read_text())
    if plan.is_uniform:  # DeepSeek's global plan prunes whole group slices: uniform here
        assert family in DEEPSEEK_LIKE and kind == "global"
        assert PER_LAYER_KEY not in config and "auto_map" not in config
        return
    assert {int(k): v for k, v in config[PER_LAYER_KEY].items()} == plan.kept_counts()
    assert config["architectures"] == [type(_MODELS[family]).__name__]
    auto = auto_class_name(model.config)
    assert config["auto_map"] == {auto: f"modeling_lightprune.{type(_MODELS[family]).__name__}"}
    remote = auto_load(out, model.config.model_type, trust_remote_code=True)
    assert type(remote).__module__.startswith("transformers_modules")
    assert counts_of(remote) == plan.kept_counts()
    torch.testing.assert_close(model_logits(remote, probe), reference, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_uniform_export_loads_with_plain_from_pretrained(tmp_path, family):
    model = fresh(family)
    plan = scored_plan(model, 0.5, "uniform", seed=1)
    probe = default_probe(model)
    reference = masked_logits(model, plan, probe)
    out = lp.export_pruned(model, plan, tmp_path / "ckpt").path

    config = json.loads((Path(out) / "config.json").read_text())
    assert PER_LAYER_KEY not in config and "auto_map" not in config
    assert not (Path(out) / MODELING_FILE).exists()
    from transformers import AutoConfig

    saved = AutoConfig.from_pretrained(out)
    text = saved.text_config if FAMILIES[saved.model_type].multimodal else saved
    assert config_count(text, FAMILIES[saved.model_type].num_experts_key) == 4  # json key may be an alias
    plain = auto_load(out, model.config.model_type)  # no lightprune, no remote code
    assert set(counts_of(plain).values()) == {4}
    torch.testing.assert_close(model_logits(plain, probe), reference, atol=ATOL, rtol=0)
    assert_only_safetensors(Path(out))


def test_manifest_records_counts_sizes_and_verification(tmp_path):
    model = fresh("qwen3_moe")
    plan = floor_plan(model)
    lp.prune_experts(model, plan)
    out = lp.save_pruned(model, tmp_path / "ckpt").path
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["experts_per_layer"] == {str(k): len(v) for k, v in plan.keep.items()}
    assert manifest["uniform"] is False
    assert manifest["parameters"] == sum(p.numel() for p in model.parameters())
    assert manifest["weight_bytes"] == (out / "model.safetensors").stat().st_size
    assert 0 < manifest["parameter_bytes"] <= manifest["weight_bytes"]
    assert manifest["verification"]["max_abs_diff"] == 0.0
    assert set(manifest["verification"]["loaders"]) == {"load_pruned", "trust_remote_code"}


def test_sharded_checkpoint_round_trip(tmp_path):
    model = fresh("deepseek_v3")
    plan = floor_plan(model)
    probe = default_probe(model)
    reference = masked_logits(model, plan, probe)
    lp.prune_experts(model, plan)
    out = lp.save_pruned(model, tmp_path / "ckpt", probe=probe, reference_logits=reference, max_shard_size="40KB").path
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 1 and (out / "model.safetensors.index.json").is_file()
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["weight_bytes"] == sum((out / s).stat().st_size for s in shards)
    torch.testing.assert_close(model_logits(lp.load_pruned(out), probe), reference, atol=ATOL, rtol=0)
    (out / shards[-1]).unlink()
    with pytest.raises(FileNotFoundError, match=shards[-1]):
        lp.load_pruned(out)


def test_bf16_save_uses_bf16_tolerance_and_keeps_dtype(tmp_path):
    # built in bf16 the way transformers loads it (model.to(bf16) would also cast the fp32 rotary buffers)
    fresh("qwen3_moe").save_pretrained(tmp_path / "fp32")
    model = auto_load(tmp_path / "fp32", "qwen3_moe", dtype=torch.bfloat16)
    lp.prune_experts(model, scored_plan(model, 0.5, "global"))
    probe = default_probe(model)
    own = model_logits(model, probe)
    out = lp.save_pruned(model, tmp_path / "ckpt", probe=probe, reference_logits=own + 5e-3).path
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["dtype"] == "bfloat16" and manifest["verification"]["atol"] == 1e-2
    assert manifest["verification"]["max_abs_diff"] == pytest.approx(5e-3, abs=1e-6)
    assert lp.load_pruned(out).dtype == torch.bfloat16
    with pytest.raises(lp.ExportVerificationError):
        lp.save_pruned(model, tmp_path / "other", probe=probe, reference_logits=own + 2e-2)
    assert_clean_parent(tmp_path, {"fp32", "ckpt"})


def test_reexport_of_a_loaded_non_uniform_checkpoint(tmp_path):
    model = fresh("mixtral")
    plan = floor_plan(model)
    probe = default_probe(model)
    reference = masked_logits(model, plan, probe)
    lp.export_pruned(model, plan, tmp_path / "a")
    loaded = lp.load_pruned(tmp_path / "a")
    out = lp.save_pruned(loaded, tmp_path / "b").path
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["MixtralForCausalLM"]
    torch.testing.assert_close(model_logits(lp.load_pruned(out), probe), reference, atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------------- generated code
def test_generated_modeling_file_imports_only_torch_and_transformers(tmp_path):
    model = fresh("internvl")
    lp.export_pruned(model, floor_plan(model), tmp_path / "ckpt")
    tree = ast.parse((tmp_path / "ckpt" / MODELING_FILE).read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots.add((node.module or "").split(".")[0])
    assert roots <= {"torch", "transformers", "__future__"}, roots


def test_remote_resize_tensor_names_are_surgerys():
    from lightprune.experts import prune
    from lightprune.models import resize as remote_resize

    assert remote_resize.EXPERT_TENSORS is prune.EXPERT_TENSORS  # one definition, copied into the remote code
    assert remote_resize.ROUTER_TENSORS is prune.ROUTER_TENSORS
    assert remote_resize.PER_LAYER_KEY == PER_LAYER_KEY


def test_load_pruned_never_runs_checkpoint_code(tmp_path):
    model = fresh("olmoe")
    plan = floor_plan(model)
    probe = default_probe(model)
    reference = masked_logits(model, plan, probe)
    out = tmp_path / REMOTE
    lp.export_pruned(model, plan, out)
    modeling = out / MODELING_FILE
    modeling.write_text("raise RuntimeError('checkpoint code was executed')\n" + modeling.read_text())
    loaded = lp.load_pruned(out)
    torch.testing.assert_close(model_logits(loaded, probe), reference, atol=ATOL, rtol=0)
    with pytest.raises(RuntimeError, match="checkpoint code was executed"):
        auto_load(out, "olmoe", trust_remote_code=True)
    with pytest.raises(RuntimeError, match="checkpoint code was executed"):
        lp.load_pruned(out, trust_remote_code=True)


# ----------------------------------------------------------------------------------- failures
def test_verification_failure_leaves_nothing(tmp_path):
    model = fresh("qwen2_moe")
    plan = scored_plan(model, 0.5, "global")
    lp.prune_experts(model, plan)
    probe = default_probe(model)
    wrong = model_logits(model, probe) + 0.5
    with pytest.raises(lp.ExportVerificationError, match=r"0\.5") as err:
        lp.save_pruned(model, tmp_path / "ckpt", probe=probe, reference_logits=wrong)
    assert err.value.max_abs_diff == pytest.approx(0.5, abs=1e-4)
    assert_clean_parent(tmp_path, set())

    # an existing checkpoint survives a failed overwrite untouched
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "keep.txt").write_text("old")
    with pytest.raises(lp.ExportVerificationError):
        lp.save_pruned(model, tmp_path / "ckpt", probe=probe, reference_logits=wrong, overwrite=True)
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["keep.txt"]
    assert_clean_parent(tmp_path, {"ckpt"})


def test_a_surgery_mismatch_is_named_and_nothing_is_written(tmp_path, monkeypatch):
    """The reloaded checkpoint differs from the masked model; the in-memory pruned model differs too, so the error
    names the surgery (not the save / load), and the output directory never appears."""
    from lightprune.export import pipeline

    real_prune = pipeline.prune_experts

    def broken_prune(model, plan, **checked):
        real_prune(model, plan, **checked)
        with torch.no_grad():
            lp.find_moe_layers(model)[0].experts.down_proj.mul_(1.5)
        return model

    monkeypatch.setattr(pipeline, "prune_experts", broken_prune)
    model = fresh("qwen3_moe")
    with pytest.raises(lp.ExportVerificationError, match="pruned model's logits differ from the masked"):
        lp.export_pruned(model, floor_plan(model), tmp_path / "ckpt")
    assert_clean_parent(tmp_path, set())


def test_existing_output_needs_overwrite(tmp_path):
    model = fresh("mixtral")
    lp.prune_experts(model, scored_plan(model, 0.5, "uniform"))
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(FileExistsError, match="ckpt"):
        lp.save_pruned(model, out)
    assert (out / "old.txt").exists()
    lp.save_pruned(model, out, overwrite=True)
    assert not (out / "old.txt").exists() and (out / "model.safetensors").exists()
    assert_clean_parent(tmp_path, {"ckpt"})

    # export_pruned checks the output before it prunes anything
    unpruned = fresh("mixtral")
    with pytest.raises(FileExistsError, match="ckpt"):
        lp.export_pruned(unpruned, scored_plan(unpruned, 0.5, "uniform"), out)
    assert set(counts_of(unpruned).values()) == {8}


def test_save_refuses_a_masked_model(tmp_path):
    model = fresh("qwen3_moe")
    with lp.mask_experts(model, floor_plan(model)), pytest.raises(ValueError, match="prune_experts"):
        lp.save_pruned(model, tmp_path / "ckpt")
    assert_clean_parent(tmp_path, set())


def test_load_pruned_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing"):
        lp.load_pruned(tmp_path / "missing")

    model = fresh("olmoe")
    lp.prune_experts(model, scored_plan(model, 0.5, "uniform"))
    good = lp.save_pruned(model, tmp_path / "good").path

    no_config = tmp_path / "no_config"
    shutil.copytree(good, no_config)
    (no_config / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no_config.*config.json"):
        lp.load_pruned(no_config)

    no_weights = tmp_path / "no_weights"
    shutil.copytree(good, no_weights)
    (no_weights / "model.safetensors").rename(no_weights / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match=r"no_weights.*no \.safetensors.*pytorch_model\.bin"):
        lp.load_pruned(no_weights)

    for cut in (4, 200, -100):
        truncated = tmp_path / f"truncated{cut}"
        shutil.copytree(good, truncated)
        data = (truncated / "model.safetensors").read_bytes()
        (truncated / "model.safetensors").write_bytes(data[:cut])
        with pytest.raises(ValueError, match=f"truncated{cut}.*corrupt or truncated"):
            lp.load_pruned(truncated)


# ----------------------------------------------------------------------------------- probe
@pytest.mark.parametrize("family", ["qwen3_vl_moe", "internvl", "gemma4", "olmoe"])
def test_default_probe_avoids_special_tokens_and_is_fixed(family):
    model = _MODELS.get(family) or fresh(family)
    probe = default_probe(model)
    assert probe["input_ids"].shape == (2, 16) and bool(probe["attention_mask"].all())
    assert torch.equal(probe["input_ids"], default_probe(model)["input_ids"])
    special = special_token_ids(model.config)
    assert special and not set(probe["input_ids"].flatten().tolist()) & special

"""Strict loading: ``lp.load_pruned`` refuses a checkpoint whose tensors do not all fit the model.

Tiny qwen3_moe checkpoints (transformers' on-disk layout: one tensor per expert, fused into 3D
parameters on load) are broken by rewriting their safetensors files: a layer's experts dropped, an
extra tensor, a wrong shape, a float tensor stored as int8, one expert's tensor dropped, a shard
deleted with its index entries. Each load raises ValueError starting with the checkpoint path and
naming the tensors (expected names computed from the files and the model), and leaves every file
unchanged. Intact checkpoints (tied embeddings, uniform ``save_pruned``, non-uniform
``export_pruned`` through both loaders) reload with the in-memory model's logits.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import lightprune as lp
from lightprune.export.verify import default_probe, model_logits

FAMILY = "qwen3_moe"
REMOTE = "lpx_strict_remote"  # loaded with trust_remote_code: transformers caches its code under this name
EXPERT = re.compile(r"^(.+\.experts)\.(\d+)\.(.+)$")


@pytest.fixture(autouse=True, scope="module")
def _forget_remote_code():
    yield
    from transformers.dynamic_module_utils import HF_MODULES_CACHE, TRANSFORMERS_DYNAMIC_MODULE_NAME

    shutil.rmtree(Path(HF_MODULES_CACHE) / TRANSFORMERS_DYNAMIC_MODULE_NAME / REMOTE, ignore_errors=True)


def saved(tiny, path: Path, **save_kwargs) -> tuple[torch.nn.Module, Path]:
    model = tiny(FAMILY)
    model.save_pretrained(path, **save_kwargs)
    return model, path


def rewrite(file: Path, edit) -> None:
    save_file(edit(load_file(file)), file, metadata={"format": "pt"})


def snapshot(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def refused(ckpt: Path, *fragments: str, **load_kwargs) -> str:
    """``load_pruned(ckpt)`` raises ValueError starting with the path and naming ``fragments`` in order."""
    before = snapshot(ckpt)
    pattern = "^" + re.escape(f"checkpoint {str(ckpt)!r} ") + ".*".join(re.escape(f) for f in ("", *fragments))
    with pytest.raises(ValueError, match=pattern) as err:
        lp.load_pruned(ckpt, **load_kwargs)
    assert snapshot(ckpt) == before
    return str(err.value)


def names_of(file: Path) -> list[str]:
    with safe_open(file, "pt") as handle:
        return sorted(handle.keys())


def fused(prefix: str, rest: str) -> str:
    """The model parameter qwen3_moe fuses the on-disk ``<prefix>.<i>.<rest>`` into."""
    return f"{prefix}.{'down_proj' if rest == 'down_proj.weight' else 'gate_up_proj'}"


# ----------------------------------------------------------------------------------- broken files
def test_layer_without_experts(tiny, tmp_path):
    model, ckpt = saved(tiny, tmp_path / "ckpt")
    gone = "model.layers.1.mlp.experts."
    rewrite(ckpt / "model.safetensors", lambda sd: {k: v for k, v in sd.items() if not k.startswith(gone)})
    expected = sorted(k for k in model.state_dict() if k.startswith(gone))
    assert len(expected) == 2  # gate_up_proj and down_proj: 3D parameters, 24 tensors on disk
    message = refused(ckpt, f"is missing {len(expected)} tensors the model needs ({', '.join(expected)})",
                      "it would load with random weights", "the model's parameters")
    assert "and " not in message.split("(")[1]


def test_unexpected_tensor(tiny, tmp_path):
    _, ckpt = saved(tiny, tmp_path / "ckpt")
    extra = "model.layers.0.mlp.extra_scale"
    rewrite(ckpt / "model.safetensors", lambda sd: {**sd, extra: torch.ones(3)})
    refused(ckpt, f"has 1 tensor the model does not have ({extra})", "would be ignored")


def test_wrong_shape(tiny, tmp_path):
    model, ckpt = saved(tiny, tmp_path / "ckpt")
    name = "model.layers.0.self_attn.q_proj.weight"
    rewrite(ckpt / "model.safetensors", lambda sd: {**sd, name: torch.zeros(4, 4)})
    want = list(model.state_dict()[name].shape)
    assert want != [4, 4]
    refused(ckpt, f"has 1 tensor of another shape than the model's ({name} [4, 4] on disk, {want} in the model)")


def test_integer_weight_refused_before_loading(tiny, tmp_path, monkeypatch):
    model, ckpt = saved(tiny, tmp_path / "ckpt")
    name = "model.norm.weight"
    rewrite(ckpt / "model.safetensors", lambda sd: {**sd, name: (sd[name] * 10).to(torch.int8)})

    def never(*args, **kwargs):
        raise AssertionError("from_pretrained read the data of a checkpoint with integer weights")

    monkeypatch.setattr(type(model), "from_pretrained", classmethod(never))
    refused(ckpt, f"stores 1 tensor as integers ({name}: I8 in model.safetensors, the model's {name} is float32",
            "lightprune loads float checkpoints; quantized or integer weights are not supported")


def test_quantization_config_refused(tiny, tmp_path):
    _, ckpt = saved(tiny, tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "fp8"}}))
    refused(ckpt, "declares quant_method \"fp8\"", "no tensor is stored in float8", "remove its quantization_config")
    (ckpt / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "awq"}}))
    refused(ckpt, "is quantized with quant_method \"awq\": AWQ int4 is not read")


def test_one_expert_lacks_a_tensor(tiny, tmp_path):
    _, ckpt = saved(tiny, tmp_path / "ckpt")
    name = "model.layers.1.mlp.experts.3.gate_proj.weight"
    assert name in names_of(ckpt / "model.safetensors")
    rewrite(ckpt / "model.safetensors", lambda sd: {k: v for k, v in sd.items() if k != name})
    refused(ckpt, f"lacks 1 tensor of experts whose other tensors it has ({name})", "as stored in the safetensors")


def _shards(tiny, tmp_path) -> tuple[torch.nn.Module, Path, dict[str, list[str]]]:
    model, ckpt = saved(tiny, tmp_path / "ckpt", max_shard_size="50KB")
    weight_map = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    shards = {f: sorted(k for k, v in weight_map.items() if v == f) for f in sorted(set(weight_map.values()))}
    assert len(shards) >= 3 and all(names_of(ckpt / f) == keys for f, keys in shards.items())
    return model, ckpt, shards


def _delete_shard(ckpt: Path, shard: str) -> None:
    index = ckpt / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"] = {k: v for k, v in data["weight_map"].items() if v != shard}
    index.write_text(json.dumps(data))
    (ckpt / shard).unlink()


def _splits_a_parameter(keys: list[str], others: set[str]) -> bool:
    """Whether ``keys`` hold some, ``others`` the rest, of the tensors fused into one model parameter."""
    groups = {fused(m[1], m[3]) for k in keys if (m := EXPERT.match(k))}
    return any((m := EXPERT.match(o)) and fused(m[1], m[3]) in groups for o in others)


def test_deleted_shard_whole_parameters(tiny, tmp_path):
    """A shard holding whole parameters (every tensor fused into each): the model's names, counted."""
    model, ckpt, shards = _shards(tiny, tmp_path)
    everything = {k for keys in shards.values() for k in keys}
    shard = next(f for f, keys in shards.items() if not _splits_a_parameter(keys, everything - set(keys)))
    expected = sorted({fused(m[1], m[3]) if (m := EXPERT.match(k)) else k for k in shards[shard]})
    assert set(expected) <= set(model.state_dict()) and len(expected) <= 8
    _delete_shard(ckpt, shard)
    refused(ckpt, f"is missing {len(expected)} tensors the model needs ({', '.join(expected)})")


def test_deleted_shard_splitting_a_parameter(tiny, tmp_path):
    """A shard holding gate_proj but not up_proj of some experts: transformers cannot fuse; the names on disk."""
    _, ckpt, shards = _shards(tiny, tmp_path)
    everything = {k for keys in shards.values() for k in keys}
    shard = next((f for f, keys in shards.items() if _splits_a_parameter(keys, everything - set(keys))), None)
    assert shard is not None, "no shard splits a fused parameter: pick another max_shard_size"
    others = [m[1] for o in everything - set(shards[shard]) if (m := EXPERT.match(o))]
    lacking = [m for k in shards[shard] if (m := EXPERT.match(k)) and m[1] in others]  # their layer remains
    expected = [m[0] for m in sorted(lacking, key=lambda m: (m[1], m[3], int(m[2])))]
    _delete_shard(ckpt, shard)
    shown = ", ".join(expected[:8]) + (f", and {len(expected) - 8} more" if len(expected) > 8 else "")
    refused(ckpt, f"lacks {len(expected)} tensors of experts whose other tensors it has ({shown})",
            "as stored in the safetensors files")


def test_strict_kwargs_are_not_overridden(tiny, tmp_path):
    _, ckpt = saved(tiny, tmp_path / "ckpt")
    with pytest.raises(TypeError, match=r"\['ignore_mismatched_sizes'\]"):
        lp.load_pruned(ckpt, ignore_mismatched_sizes=False)


# ----------------------------------------------------------------------------------- intact files
def test_tied_embeddings_load(tiny, tmp_path):
    """lm_head.weight is absent on disk with tie_word_embeddings: legitimately, transformers ties it."""
    model = tiny(FAMILY, tie_word_embeddings=True)
    model.save_pretrained(tmp_path / "ckpt")
    assert "lm_head.weight" not in names_of(tmp_path / "ckpt" / "model.safetensors")
    reloaded = lp.load_pruned(tmp_path / "ckpt")
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    probe = default_probe(model)
    torch.testing.assert_close(model_logits(reloaded, probe), model_logits(model, probe), atol=1e-6, rtol=0)


def test_uniform_save_pruned_loads(tiny, tmp_path):
    model = tiny(FAMILY)
    lp.prune_experts(model, lp.select_experts(lp.score_weights(model, "aimer"), ratio=0.5))
    lp.save_pruned(model, tmp_path / "out")
    reloaded = lp.load_pruned(tmp_path / "out")
    assert [layer.num_experts for layer in lp.find_moe_layers(reloaded)] == [4, 4, 4]
    probe = default_probe(model)
    torch.testing.assert_close(model_logits(reloaded, probe), model_logits(model, probe), atol=1e-6, rtol=0)


def _non_uniform(tiny, out: Path) -> tuple[torch.nn.Module, dict[str, torch.Tensor], torch.Tensor]:
    model = tiny(FAMILY)
    plan = lp.ExpertPlan(keep={0: [0, 1, 2, 3, 4], 1: [7, 6], 2: list(range(8))}, num_experts={0: 8, 1: 8, 2: 8})
    probe = default_probe(model)
    with lp.mask_experts(model, plan):
        reference = model_logits(model, probe)
    lp.export_pruned(model, plan, out)
    return model, probe, reference


@pytest.mark.parametrize("trust_remote_code", [False, True])
def test_non_uniform_export_loads_and_is_strict(tiny, tmp_path, trust_remote_code):
    out = tmp_path / REMOTE
    model, probe, reference = _non_uniform(tiny, out)
    reloaded = lp.load_pruned(out, trust_remote_code=trust_remote_code)
    assert [layer.num_experts for layer in lp.find_moe_layers(reloaded)] == [5, 2, 8]
    torch.testing.assert_close(model_logits(reloaded, probe), reference, atol=1e-5, rtol=0)

    gone = "model.layers.1.mlp.experts."
    expected = sorted(k for k in model.state_dict() if k.startswith(gone))
    rewrite(out / "model.safetensors", lambda sd: {k: v for k, v in sd.items() if not k.startswith(gone)})
    refused(out, f"is missing 2 tensors the model needs ({', '.join(expected)})", trust_remote_code=trust_remote_code)

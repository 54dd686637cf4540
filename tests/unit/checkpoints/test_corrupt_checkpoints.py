"""Every checkpoint corruption through every path that reads a checkpoint: the same refusal, before any work.

Each case damages a copy of a clean tiny Qwen3-MoE checkpoint the way it happens (an interrupted copy, a hand-edited
config, mixed files in one folder, a wrong tool's output) and runs it through the in-memory loader
(``lp.load_pruned``) and the three streamed paths (``lp.score_weights(dir)``, ``lp.prune_checkpoint(dir, ...)``,
``lp.collect_expert_stats(dir, ...)``): each must raise the same error, with the same message naming the file or
tensor and the values, leave the checkpoint as it was and write no output. Files that are not the model's are
ignored by every path alike.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import lightprune as lp

GATE = "model.layers.0.mlp.gate.weight"
_DEEP = "[" * 100_000 + "]" * 100_000  # past Python's recursion limit: refused before json recurses
_EXPERT_3 = "model.layers.1.mlp.experts.3.gate_proj.weight"
PATHS = ("load_pruned", "score_weights", "prune_checkpoint", "collect_expert_stats")


# ----------------------------------------------------------------------------------- the clean checkpoints
@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """(model, {"single": dir, "sharded": dir, "mllm": dir}) of one tiny Qwen3-MoE (3 layers of 8 experts, top-2, fp32),
    and of a tiny Qwen3-VL-MoE for the vision tower's config (refused before any plan or batch is looked at)."""
    from lightprune.models.tiny import tiny_model

    model = tiny_model("qwen3_moe", seed=0).eval()
    root = tmp_path_factory.mktemp("clean")
    model.save_pretrained(root / "single")
    model.save_pretrained(root / "sharded", max_shard_size="20KB")
    assert len(list((root / "sharded").glob("*.safetensors"))) >= 4
    tiny_model("qwen3_vl_moe", seed=0).save_pretrained(root / "mllm")
    return model, {"single": root / "single", "sharded": root / "sharded", "mllm": root / "mllm"}


def _plan(model) -> lp.ExpertPlan:
    return lp.select_experts(lp.score_weights(model, "random", seed=1), ratio=0.5)


def _batches() -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(1, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": ids, "attention_mask": torch.ones_like(ids)}]


def run_path(name: str, path: Path, model, out: Path) -> object:
    if name == "load_pruned":
        return lp.load_pruned(path)
    if name == "score_weights":
        return lp.score_weights(path, "aimer", progress=False)
    if name == "prune_checkpoint":
        return lp.prune_checkpoint(path, _plan(model), out, progress=False)
    return lp.collect_expert_stats(path, _batches(), criteria=["frequency"], progress=False)


# ----------------------------------------------------------------------------------- damage
def _header(file: Path) -> tuple[dict, bytes]:
    data = file.read_bytes()
    length = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + length]), data[8 + length:]


def _write_header(file: Path, text: str, body: bytes) -> None:
    raw = text.encode()
    raw += b" " * (-len(raw) % 8)
    file.write_bytes(len(raw).to_bytes(8, "little") + raw + body)


def _edit_header(edit: Callable[[dict], str | dict]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        header, body = _header(path / "model.safetensors")
        text = edit(header)
        _write_header(path / "model.safetensors", text if isinstance(text, str) else json.dumps(text), body)
    return damage


def _entry(header: dict, key: str = GATE, **fields) -> dict:
    header[key] = {**header[key], **fields}
    return header


def _overlap(header: dict) -> dict:
    """Two tensors of one size: the second pointed at the first's bytes (the file's size unchanged: a gap)."""
    by_size: dict[int, list[str]] = {}
    for key, info in header.items():
        if key != "__metadata__":
            by_size.setdefault(info["data_offsets"][1] - info["data_offsets"][0], []).append(key)
    first, second = sorted(next(keys for keys in by_size.values() if len(keys) > 1),
                           key=lambda k: header[k]["data_offsets"][0])[:2]
    header[second] = {**header[second], "data_offsets": list(header[first]["data_offsets"])}
    return header


def _twice(header: dict) -> str:
    text = json.dumps(header)
    return text[:-1] + f', "{GATE}": {json.dumps(header[GATE])}' + "}"


def _tensors(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        tensors = load_file(path / "model.safetensors")
        edit(tensors)
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return damage


def _config(**changes) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        config = json.loads((path / "config.json").read_text())
        config.update(changes)
        (path / "config.json").write_text(json.dumps(config, indent=2))
    return damage


def _zero_size_experts(path: Path) -> None:
    """Every expert's projections stored with a 0 dimension, as config.json's ``moe_intermediate_size: 0`` says."""
    def empty(tensors: dict) -> None:
        for key in [k for k in tensors if ".experts." in k]:
            tensors[key] = torch.empty(0, 32) if key.endswith(("gate_proj.weight", "up_proj.weight")) else \
                torch.empty(32, 0)
    _tensors(empty)(path)
    _config(moe_intermediate_size=0)(path)


def _edit_vision(path: Path, **changes) -> None:
    config = json.loads((path / "config.json").read_text())
    config["vision_config"].update(changes)
    (path / "config.json").write_text(json.dumps(config, indent=2))


def _config_text(edit: Callable[[str], str]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        (path / "config.json").write_text(edit((path / "config.json").read_text()))
    return damage


def _index(edit: Callable[[dict, Path], None]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        index = json.loads((path / "model.safetensors.index.json").read_text())
        edit(index["weight_map"], path)
        (path / "model.safetensors.index.json").write_text(json.dumps(index))
    return damage


def _shards(weight_map: dict) -> list[str]:
    return sorted(set(weight_map.values()))


def _moved_to_another_shard(weight_map: dict, path: Path) -> None:
    shards = _shards(weight_map)
    key = next(k for k, f in sorted(weight_map.items()) if f == shards[1])
    weight_map[key] = shards[2]


def _listed_but_absent(weight_map: dict, path: Path) -> None:
    weight_map["model.layers.0.mlp.ghost.weight"] = _shards(weight_map)[0]


def _missing_shard(weight_map: dict, path: Path) -> None:
    (path / _shards(weight_map)[1]).unlink()


def _unlisted_tensor(weight_map: dict, path: Path) -> None:
    file = path / _shards(weight_map)[0]
    tensors = load_file(file)
    tensors["model.layers.0.mlp.ghost.weight"] = torch.zeros(2, 2)
    save_file(tensors, file, metadata={"format": "pt"})


def _stored_twice(weight_map: dict, path: Path) -> None:
    shards = _shards(weight_map)
    copied = next(k for k, f in sorted(weight_map.items()) if f == shards[0])
    file = path / shards[1]
    tensors = load_file(file)
    tensors[copied] = load_file(path / shards[0])[copied]
    save_file(tensors, file, metadata={"format": "pt"})


def _no_index(path: Path) -> None:
    (path / "model.safetensors.index.json").unlink()


def _adapter_only(path: Path) -> None:
    (path / "model.safetensors").rename(path / "adapter_model.safetensors")


def _del(key: str) -> Callable[[dict], None]:
    return lambda tensors: tensors.pop(key)


def _retype(dtype: torch.dtype) -> Callable[[dict], None]:
    def edit(tensors: dict) -> None:
        tensors[GATE] = tensors[GATE].to(dtype)
    return edit


def _extra(tensors: dict) -> None:
    tensors["model.layers.0.mlp.extra.weight"] = torch.zeros(2, 2)


def _transposed(tensors: dict) -> None:
    tensors[GATE] = tensors[GATE].t().contiguous()


#: name -> (which clean checkpoint, the damage, fragments the refusal names, in order)
CASES: dict[str, tuple[str, Callable[[Path], None], tuple[str, ...]]] = {
    # the files: headers against bytes
    "truncated": ("single", lambda p: (p / "model.safetensors").write_bytes((p / "model.safetensors").read_bytes()[:-10]),
                  ("model.safetensors' is corrupt or truncated", "its tensors end at byte")),
    "dtype disagrees with its bytes": ("single", _edit_header(lambda h: _entry(h, dtype="F16")),
                                       (f"tensor '{GATE}': F16 [8, 32] is 512 bytes", "span 1024")),
    "shape disagrees with its bytes": ("single", _edit_header(lambda h: _entry(h, shape=[4, 32])),
                                       (f"tensor '{GATE}': F32 [4, 32] is 512 bytes", "span 1024")),
    "shape not integers": ("single", _edit_header(lambda h: _entry(h, shape=[8.0, 32])),
                           (f"tensor '{GATE}' has shape [8.0, 32], not a list of non-negative integers",)),
    "unknown dtype": ("single", _edit_header(lambda h: _entry(h, dtype="F4")),
                      (f"tensor '{GATE}' has dtype \"F4\", which lightprune does not read",)),
    "overlapping ranges": ("single", _edit_header(_overlap), ("overlaps",)),
    "key named twice": ("single", _edit_header(_twice), (f"the header names '{GATE}' twice",)),
    "header nested 100,000 deep": ("single", _edit_header(lambda h: json.dumps(h)[:-1] + ', "x": ' + _DEEP + "}"),
                                   ("model.safetensors' (its header): JSON nested 100001 levels deep (limit 100)",)),
    # the files: which are the weights, the shard index
    "shards without their index": ("sharded", _no_index, ("holds shards (model-00001-of-", f"but no {'model.safetensors.index.json'}")),
    "index names a missing shard": ("sharded", _index(_missing_shard), ("shard index names missing files",)),
    "index puts a tensor in another shard": ("sharded", _index(_moved_to_another_shard), ("the index and the shards disagree",)),
    "index lists a tensor no shard holds": ("sharded", _index(_listed_but_absent),
                                            ("lists 1 tensor(s) no shard holds (model.layers.0.mlp.ghost.weight in",)),
    "a shard holds a tensor the index does not list": ("sharded", _index(_unlisted_tensor),
                                                       ("does not list 1 tensor(s) the shards hold (model.layers.0.mlp.ghost.weight",)),
    "a tensor stored in two shards": ("sharded", _index(_stored_twice), ("is stored twice",)),
    "only an adapter's weights": ("single", _adapter_only,
                                  ("has no .safetensors weights", "found ['adapter_model.safetensors'], not a model's weights file")),
    # config.json
    "config names a key twice": ("single", _config_text(lambda t: t.rstrip()[:-1] + ', "num_local_experts": 4}'),
                                 ("key 'num_local_experts' appears twice in one JSON object (values 8 and 4)",)),
    "config is not JSON": ("single", _config_text(lambda t: t[:-5]), ("config.json", "is not valid JSON")),
    "config nested 100,000 deep": ("single", _config_text(lambda t: t.rstrip()[:-1] + ', "x": ' + _DEEP + "}"),
                                   ("config.json': JSON nested 100001 levels deep (limit 100)",)),
    "shard index nested 100,000 deep": ("sharded", lambda p: (p / "model.safetensors.index.json").write_text(
        '{"weight_map": {}, "metadata": ' + _DEEP + "}"), ("model.safetensors.index.json': JSON nested 100001 levels "
                                                             "deep (limit 100)",)),
    "quantized": ("single", _config(quantization_config={"quant_method": "fp8"}), ("is quantized", "'fp8'")),
    "config claims 1e20 layers": ("single", _config(num_hidden_layers=10 ** 20),
                                  ("num_hidden_layers is 100000000000000000000, the weights hold 3 numbered layers",)),
    "vision tower claims 1e20 layers": ("mllm", lambda p: _edit_vision(p, depth=10 ** 20),
                                        ("config.json's vision_config.depth is 100000000000000000000, the weights hold",
                                         "tensors (a layer holds at least one)")),
    "config claims 4 layers over 3": ("single", _config(num_hidden_layers=4),
                                      ("num_hidden_layers is 4, the weights hold 3 numbered layers",)),
    "config claims 2 layers over 3": ("single", _config(num_hidden_layers=2),
                                      ("has 33 tensors the model does not have (model.layers.2.", "would be ignored")),
    "top_k 0": ("single", _config(num_experts_per_tok=0), ("layer 0: top_k 0 of 8 experts",)),
    "top_k -1": ("single", _config(num_experts_per_tok=-1), ("layer 0: top_k -1 of 8 experts",)),
    "top_k above the experts": ("single", _config(num_experts_per_tok=9), ("layer 0: top_k 9 of 8 experts",)),
    "zero-size experts": ("single", _zero_size_experts,
                          ("cannot be pruned: layer 0: zero-size expert tensor model.layers.0.mlp.experts.gate_up_proj "
                           "[8, 0, 32] (config moe_intermediate_size: 0) and 1 more tensor, and 2 more layers",)),
    "config claims more experts": ("single", _config(num_local_experts=10),
                                   ("needs experts 0..9 of mlp.experts.*.down_proj.weight", "[0, 1, 2, 3, 4, 5, 6, 7]")),
    "config claims 1e9 experts": ("single", _config(num_local_experts=10 ** 9),
                                  ("needs experts 0..999999999 of mlp.experts.*.down_proj.weight",)),
    "config claims fewer experts": ("single", _config(num_local_experts=6),
                                    ("needs experts 0..5 of mlp.experts.*.down_proj.weight",)),
    "config dtype differs from the stored one": ("single", _config(dtype="bfloat16"),
                                                 ("config.json says dtype bfloat16, its weights are stored in float32",)),
    # the tensors against the model
    "an int8 tensor": ("single", _tensors(_retype(torch.int8)),
                       (f"stores 1 tensor as integers ({GATE}: I8 in model.safetensors, the model's {GATE} is float32",)),
    "a bool tensor": ("single", _tensors(_retype(torch.bool)), (f"({GATE}: BOOL in model.safetensors",)),
    "a tensor the model does not have": ("single", _tensors(_extra),
                                         ("has 1 tensor the model does not have (model.layers.0.mlp.extra.weight)",)),
    "a missing tensor": ("single", _tensors(_del("model.layers.1.post_attention_layernorm.weight")),
                         ("is missing 1 tensor the model needs (model.layers.1.post_attention_layernorm.weight)",)),
    "a transposed tensor": ("single", _tensors(_transposed),
                            (f"({GATE} [32, 8] on disk, [8, 32] in the model)",)),
    "an expert lacking a tensor": ("single", _tensors(_del(_EXPERT_3)),
                                   (f"lacks 1 tensor of experts whose other tensors it has ({_EXPERT_3})",)),
}


def _snapshot(path: Path) -> dict[str, bytes]:
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_refuses_a_corrupt_checkpoint_alike(clean, tmp_path, case):
    model, dirs = clean
    which, damage, fragments = CASES[case]
    path = tmp_path / "ckpt"
    shutil.copytree(dirs[which], path)
    damage(path)
    before = _snapshot(path)
    refusals = {}
    for name in PATHS:
        out = tmp_path / f"out-{name}"
        with pytest.raises((ValueError, FileNotFoundError)) as err:
            run_path(name, path, model, out)
        refusals[name] = (type(err.value), str(err.value))
        assert not out.exists() and not list(tmp_path.glob(f".{out.name}*")), name
    assert len(set(refusals.values())) == 1, refusals  # one refusal, whichever path reads it
    _, message = refusals["load_pruned"]
    assert str(path) in message, message
    at = 0
    for fragment in fragments:
        found = message.find(fragment, at)
        assert found >= 0, (fragment, message)
        at = found + len(fragment)
    assert _snapshot(path) == before  # nothing in the checkpoint changed


# ----------------------------------------------------------------------------------- files that are not the model's
def _stray_files(path: Path) -> None:
    save_file({"base_model.model.lora_A.weight": torch.zeros(2, 2)}, path / "adapter_model.safetensors")
    save_file({"state.0.exp_avg": torch.zeros(3)}, path / "optimizer.safetensors")
    (path / "optimizer.pt").write_bytes(b"not a pickle")


@pytest.mark.parametrize("which", ["single", "sharded"])
def test_files_that_are_not_the_models_are_ignored_by_every_path(clean, tmp_path, which):
    model, dirs = clean
    path = tmp_path / "ckpt"
    shutil.copytree(dirs[which], path)
    _stray_files(path)
    loaded = lp.load_pruned(path)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())
    expected = lp.score_weights(model, "aimer")
    got = lp.score_weights(path, "aimer", progress=False)
    assert all(torch.equal(got.raw[i], expected.raw[i]) for i in expected.raw)
    result = lp.prune_checkpoint(path, _plan(model), tmp_path / "out", progress=False)
    written = sorted(p.name for p in Path(result).iterdir())
    assert not {"adapter_model.safetensors", "optimizer.safetensors", "optimizer.pt"} & set(written), written
    streamed = lp.collect_expert_stats(path, _batches(), criteria=["frequency"], progress=False)
    in_memory = lp.collect_expert_stats(model, _batches(), criteria=["frequency"], progress=False)
    expected_counts, got_counts = in_memory.raw("frequency"), streamed.raw("frequency")
    assert got_counts.raw.keys() == expected_counts.raw.keys()
    assert all(torch.equal(got_counts.raw[i], expected_counts.raw[i]) for i in expected_counts.raw)


def test_tensors_the_models_class_ignores_are_accepted_alike_and_carried_by_the_streamed_export(tiny, tmp_path):
    """A DeepSeek-V3 checkpoint's multi-token-prediction layer (``model.layers.61.*``, which transformers' class
    lists in ``_keys_to_ignore_on_load_unexpected``) is not refused by any path: loading ignores it, the streamed
    export copies it unchanged and records it."""
    model = tiny("deepseek_v3", seed=1).eval()
    path = tmp_path / "ckpt"
    model.save_pretrained(path)
    mtp = {"model.layers.61.eh_proj.weight": torch.randn(4, 8), "model.layers.61.enorm.weight": torch.ones(8)}
    tensors = load_file(path / "model.safetensors")
    save_file({**tensors, **mtp}, path / "model.safetensors", metadata={"format": "pt"})
    loaded = lp.load_pruned(path)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())
    expected = lp.score_weights(model, "aimer")
    got = lp.score_weights(path, "aimer", progress=False)
    assert all(torch.equal(got.raw[i], expected.raw[i]) for i in expected.raw)
    result = lp.prune_checkpoint(path, _plan(model), tmp_path / "out", progress=False)
    assert result.manifest["copied_without_model_tensor"] == sorted(mtp)
    written = load_file(Path(result) / "model.safetensors")
    assert all(torch.equal(written[k], v) for k, v in mtp.items())


def test_an_fp8_tensor_is_accepted_alike_where_transformers_accepts_it(clean, tmp_path):
    """fp8 is a floating dtype: a tensor stored in float8_e4m3fn loads upcast to the model's dtype, and the streamed
    scores of the checkpoint equal those of the loaded model."""
    _, dirs = clean
    path = tmp_path / "ckpt"
    shutil.copytree(dirs["single"], path)
    tensors = load_file(path / "model.safetensors")
    tensors[GATE] = tensors[GATE].to(torch.float8_e4m3fn)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    loaded = lp.load_pruned(path)
    assert loaded.state_dict()[GATE].dtype == torch.float32
    assert torch.equal(loaded.state_dict()[GATE], tensors[GATE].float())
    expected, got = lp.score_weights(loaded, "aimer"), lp.score_weights(path, "aimer", progress=False)
    assert all(torch.equal(got.raw[i], expected.raw[i]) for i in expected.raw)

"""Every checkpoint corruption through every path that reads a checkpoint: the same refusal, before any work.

Each case damages a copy of a clean tiny Qwen3-MoE checkpoint the way it happens (an interrupted copy, a hand-edited
config, mixed files in one folder, a wrong tool's output) and runs it through the in-memory loader
(``lp.load_pruned``) and the three streamed paths (``lp.score_weights(dir)``, ``lp.prune_checkpoint(dir, ...)``,
``lp.collect_expert_stats(dir, ...)``): each must raise the same error, with the same message naming the file or
tensor and the values, leave the checkpoint as it was and write no output. Files that are not the model's are
ignored by every path alike; files a loader could take for the model's are refused (model.safetensors beside a shard
index, or beside stray shards) or named (transformers' pickle weights); a link, a folder or a name that is not UTF-8
where a file or folder is read, and a file that cannot be read, is one line naming it on every path.
"""

from __future__ import annotations

import errno
import json
import math
import os
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
    from lightprune.testing.tiny import tiny_model

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


def _beside_an_index(path: Path) -> None:
    """A shard index and its shards (another save of the model) beside ``model.safetensors``."""
    sharded = path.parent / "sharded-copy"
    lp.load_pruned(path).save_pretrained(sharded, max_shard_size="20KB")
    for file in sharded.iterdir():
        if file.name.startswith("model") and file.name != "model.safetensors":
            shutil.copy(file, path / file.name)


def _stray_shard(path: Path) -> None:
    shutil.copy(path / "model.safetensors", path / "model-00001-of-00002.safetensors")


def _link(name: str, target: str) -> Callable[[Path], None]:
    """``name`` replaced by a symlink to ``target`` (relative to the checkpoint; itself: a loop)."""
    def damage(path: Path) -> None:
        (path / name).unlink()
        (path / name).symlink_to(path / target)
    return damage


def _made_a_directory(name: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        (path / name).unlink()
        (path / name).mkdir()
    return damage


def _header_bytes(edit: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    """The header's JSON bytes edited (its length prefix follows them)."""
    def damage(path: Path) -> None:
        data = (path / "model.safetensors").read_bytes()
        length = int.from_bytes(data[:8], "little")
        raw = edit(data[8:8 + length])
        (path / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + length:])
    return damage


def _dangling_shard(weight_map: dict, path: Path) -> None:
    _link(_shards(weight_map)[1], "gone.safetensors")(path)


def _dot_slash_up(weight_map: dict, path: Path) -> None:
    first = _shards(weight_map)[0]
    for key, file in weight_map.items():
        if file == first:
            weight_map[key] = f"./../{path.name}/{file}"


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
    "truncated": ("single",
                  lambda p: (p / "model.safetensors").write_bytes((p / "model.safetensors").read_bytes()[:-10]),
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
    "shards without their index": ("sharded", _no_index,
                                   ("holds shards (model-00001-of-", f"but no {'model.safetensors.index.json'}")),
    "index names a missing shard": ("sharded", _index(_missing_shard), ("shard index names missing files",)),
    "index puts a tensor in another shard": ("sharded", _index(_moved_to_another_shard),
                                             ("the index and the shards disagree",)),
    "index lists a tensor no shard holds": ("sharded", _index(_listed_but_absent),
                                            ("lists 1 tensor(s) no shard holds (model.layers.0.mlp.ghost.weight in",)),
    "a shard holds a tensor the index does not list": ("sharded", _index(_unlisted_tensor),
                                                       ("does not list 1 tensor(s) the shards hold "
                                                        "(model.layers.0.mlp.ghost.weight",)),
    "a tensor stored in two shards": ("sharded", _index(_stored_twice), ("is stored twice",)),
    "model.safetensors beside a shard index": ("single", _beside_an_index,
                                               ("holds both model.safetensors and model.safetensors.index.json with "
                                                "its shards (model-00001-of-", "transformers loads model.safetensors",
                                                "remove (or move away) one of the two")),
    "a stray shard beside model.safetensors": ("single", _stray_shard,
                                               ("holds shard files (model-00001-of-00002.safetensors) beside "
                                                "model.safetensors, without an index", "remove (or move away)")),
    "index names a shard outside the folder": ("sharded", _index(_dot_slash_up), ("names ['./../ckpt/model-0000",
                                                                                   "shards are .safetensors files in "
                                                                                   "the checkpoint directory")),
    "weights a dangling symlink": ("single", _link("model.safetensors", "gone.safetensors"),
                                   ("its weights file model.safetensors is a dangling symlink (its target",
                                    "gone.safetensors' does not exist)")),
    "weights a symlink loop": ("single", _link("model.safetensors", "model.safetensors"),
                               ("its weights file model.safetensors is a symlink loop (->",)),
    "weights a directory": ("single", _made_a_directory("model.safetensors"),
                            ("its weights file model.safetensors is a directory, not a file",)),
    "a shard a dangling symlink": ("sharded", _index(_dangling_shard),
                                   ("the shard model-00002-of-", ".safetensors is a dangling symlink",)),
    "shard index a directory": ("sharded", _made_a_directory("model.safetensors.index.json"),
                                ("its shard index model.safetensors.index.json is a directory, not a file",)),
    "config a directory": ("single", _made_a_directory("config.json"), ("its config.json is a directory, not a file",)),
    "config a dangling symlink": ("single", _link("config.json", "elsewhere.json"),
                                  ("its config.json is a dangling symlink",)),
    "header starts with a byte-order mark": ("single", _header_bytes(lambda raw: b"\xef\xbb\xbf" + raw),
                                             ("model.safetensors' is corrupt or truncated: its header starts with a "
                                              "UTF-8 byte-order mark",)),
    "header in UTF-16": ("single", _header_bytes(lambda raw: raw.decode().encode("utf-16")),
                         ("model.safetensors' is corrupt or truncated: 'utf-8' codec can't decode",)),
    "header with a lone surrogate escape": ("single", _header_bytes(lambda raw: raw.replace(b'"pt"', b'"\\udcff"')),
                                            ("the header holds the string '\\udcff' with a lone surrogate escape",)),
    "header with NaN": ("single", _header_bytes(lambda raw: raw.replace(b'"pt"', b'"pt","x":NaN')),
                        ("the header holds NaN, which is not JSON",)),
    "only an adapter's weights": ("single", _adapter_only,
                                  ("has no .safetensors weights",
                                   "found ['adapter_model.safetensors'], not a model's weights file")),
    # config.json
    "config names a key twice": ("single", _config_text(lambda t: t.rstrip()[:-1] + ', "num_local_experts": 4}'),
                                 ("key 'num_local_experts' appears twice in one JSON object (values 8 and 4)",)),
    "config is not JSON": ("single", _config_text(lambda t: t[:-5]), ("config.json", "is not valid JSON")),
    "config nested 100,000 deep": ("single", _config_text(lambda t: t.rstrip()[:-1] + ', "x": ' + _DEEP + "}"),
                                   ("config.json': JSON nested 100001 levels deep (limit 100)",)),
    "shard index nested 100,000 deep": ("sharded", lambda p: (p / "model.safetensors.index.json").write_text(
        '{"weight_map": {}, "metadata": ' + _DEEP + "}"), ("model.safetensors.index.json': JSON nested 100001 levels "
                                                             "deep (limit 100)",)),
    "quantized": ("single", _config(quantization_config={"quant_method": "fp8"}),
                  ('declares quant_method "fp8"', "no tensor is stored in float8")),
    "config NaN": ("single", _config_text(lambda t: t.replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": NaN')),
                   ("config.json's rms_norm_eps is nan: a non-finite number",)),
    "config Infinity, nested": ("single", _config(rope_parameters={"rope_type": "default", "rope_theta": math.inf}),
                                ("config.json's rope_parameters.rope_theta is inf",)),
    "config -1e999 in a list": ("single", _config_text(lambda t: t.rstrip()[:-1] + ', "x": [1, -1e999]}'),
                                ("config.json's x[1] is -inf",)),
    "config unknown activation": ("single", _config(hidden_act="swishy"),
                                  ("config.json's hidden_act is 'swishy', an activation transformers does not know "
                                   "(did you mean 'swish'",)),
    "config unknown nested activation": ("mllm", lambda p: _edit_vision(p, hidden_act="gelu_fast_x"),
                                         ("config.json's vision_config.hidden_act is 'gelu_fast_x'",)),
    "config points transformers at other weights": ("single", _config(transformers_weights="other.safetensors"),
                                                    ("config.json's transformers_weights is 'other.safetensors': "
                                                     "transformers loads that file instead",)),
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
                                   ("needs experts 0..9 of mlp.experts.*.down_proj.weight",
                                    "[0, 1, 2, 3, 4, 5, 6, 7]")),
    "config claims 1e9 experts": ("single", _config(num_local_experts=10 ** 9),
                                  ("needs experts 0..999999999 of mlp.experts.*.down_proj.weight",)),
    "config claims fewer experts": ("single", _config(num_local_experts=6),
                                    ("needs experts 0..5 of mlp.experts.*.down_proj.weight",)),
    "config dtype differs from the stored one": ("single", _config(dtype="bfloat16"),
                                                 ("config.json says dtype bfloat16, its weights are stored in "
                                                  "float32",)),
    # the tensors against the model
    "an int8 tensor": ("single", _tensors(_retype(torch.int8)),
                       (f"stores 1 tensor as integers ({GATE}: I8 in model.safetensors, the model's {GATE} is "
                        "float32",)),
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
        with pytest.raises((ValueError, OSError)) as err:
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


# ----------------------------------------------------------------------------------- names and files, every path alike
def _refusals(path: Path, model, tmp_path: Path, error: type[BaseException] = Exception) -> dict[str, tuple]:
    found = {}
    for name in PATHS:
        out = tmp_path / f"out-{name}"
        with pytest.raises(error) as err:
            run_path(name, path, model, out)
        found[name] = (type(err.value), str(err.value))
        assert not out.exists() and not list(tmp_path.glob(f".{out.name}*")), name
    return found


def test_a_shard_index_naming_its_shards_with_a_dot_slash_is_read_as_transformers_reads_it(clean, tmp_path):
    model, dirs = clean
    path = tmp_path / "ckpt"
    shutil.copytree(dirs["sharded"], path)
    _index(lambda weight_map, _: weight_map.update({k: f"./{v}" for k, v in weight_map.items()}))(path)
    loaded = lp.load_pruned(path)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())
    expected, got = lp.score_weights(model, "aimer"), lp.score_weights(path, "aimer", progress=False)
    assert all(torch.equal(got.raw[i], expected.raw[i]) for i in expected.raw)
    result = lp.prune_checkpoint(path, _plan(model), tmp_path / "out", progress=False)
    written = json.loads((Path(result) / "model.safetensors.index.json").read_text())["weight_map"]
    assert not any(file.startswith("./") for file in written.values())


@pytest.mark.parametrize("pickles", [["pytorch_model.bin"], ["pytorch_model-00001-of-00002.bin",
                                                             "pytorch_model.bin.index.json"]])
def test_transformers_pickle_weights_beside_the_safetensors_are_named_by_every_path(clean, tmp_path, pickles):
    model, dirs = clean
    path = tmp_path / "ckpt"
    shutil.copytree(dirs["single"], path)
    for name in pickles:
        (path / name).write_bytes(b"another model")
    said = set()
    for name in PATHS:
        with pytest.warns(UserWarning) as caught:
            run_path(name, path, model, tmp_path / f"out-{name}")
        ours = [str(w.message) for w in caught if "beside its safetensors weights" in str(w.message)]
        assert ours, name
        said.update(ours)
    assert said == {f"checkpoint {str(path)!r} holds {', '.join(sorted(pickles))} beside its safetensors weights: "
                    "lightprune (and transformers, unless use_safetensors=False) reads the safetensors files and "
                    "ignores them; delete them if they are not the same model"}
    written = sorted(p.name for p in (tmp_path / "out-prune_checkpoint").iterdir())
    assert not set(pickles) & set(written)


def test_a_checkpoint_folder_named_with_bytes_that_are_not_utf8_is_refused_by_every_path(clean, tmp_path):
    model, dirs = clean
    path = tmp_path / os.fsdecode(b"ck\xff")
    shutil.copytree(dirs["single"], path)
    refusals = _refusals(path, model, tmp_path, ValueError)
    assert set(refusals.values()) == {(ValueError, f"checkpoint directory {str(path)!r} is not UTF-8 text (byte "
                                                   "0xff): lightprune records paths in JSON; rename it")}
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        lp.prune_checkpoint(dirs["single"], _plan(model), tmp_path / os.fsdecode(b"out\xff"), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


@pytest.mark.parametrize("what", ["a file", "a dangling symlink", "a symlink loop"])
def test_a_checkpoint_path_that_is_not_a_folder_is_said_as_such_by_every_path(clean, tmp_path, what):
    from lightprune.core.sources import check_checkpoint_name

    model, dirs = clean
    shutil.copytree(dirs["single"], tmp_path / "ckpt")
    path = {"a file": tmp_path / "ckpt" / "model.safetensors", "a dangling symlink": tmp_path / "link",
            "a symlink loop": tmp_path / "loop"}[what]
    if what != "a file":
        path.symlink_to(tmp_path / ("gone" if what == "a dangling symlink" else "loop"))
    expected = {"a file": f"checkpoint directory {str(path)!r} is a file, not a directory: give its folder "
                          f"{str(tmp_path / 'ckpt')!r}",
                "a dangling symlink": f"checkpoint directory {str(path)!r} is a dangling symlink (its target "
                                      f"{str(tmp_path / 'gone')!r} does not exist); restore it, or give the directory",
                "a symlink loop": f"checkpoint directory {str(path)!r} is a symlink loop (-> {str(path)!r}); point "
                                  "it at the directory, or give the directory itself"}[what]
    refusals = _refusals(path, model, tmp_path, OSError)
    assert {message for _, message in refusals.values()} == {expected}
    with pytest.raises(OSError) as err:
        check_checkpoint_name(str(path))  # the command's check of --model.init_args.checkpoint
    assert str(err.value) == expected


@pytest.mark.parametrize("code", [errno.EACCES, errno.EISDIR, errno.ELOOP])
def test_an_input_file_that_cannot_be_read_is_one_line_naming_it_on_every_path(clean, tmp_path, monkeypatch, code):
    from lightprune.checkpoints import header

    model, dirs = clean
    path = tmp_path / "ckpt"
    shutil.copytree(dirs["single"], path)
    real_open = open

    def refused(file, *args, **kwargs):
        if Path(file).name == "model.safetensors":
            raise OSError(code, os.strerror(code), str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(header, "open", refused, raising=False)
    refusals = _refusals(path, model, tmp_path, OSError)
    assert len(set(refusals.values())) == 1, refusals
    cls, message = refusals["load_pruned"]
    assert cls is type(OSError(code, "x")) and "\n" not in message
    assert message.startswith(f"cannot read {str(path / 'model.safetensors')!r}: {os.strerror(code).lower()}; ")


# ----------------------------------------------------------------------------------- config.json values transformers refuses
def _one_refusal(clean, tmp_path: Path, which: str, damage: Callable[[Path], None]) -> tuple[Path, type, str]:
    """(the damaged checkpoint, the error class, the message) of the refusal every path gives, checked to be one,
    before anything is written and with the checkpoint left as it was."""
    model, dirs = clean
    path = tmp_path / "ckpt"
    shutil.copytree(dirs[which], path)
    damage(path)
    before = _snapshot(path)
    refusals = _refusals(path, model, tmp_path)
    assert len(set(refusals.values())) == 1, refusals
    assert _snapshot(path) == before
    cls, message = refusals["load_pruned"]
    return path, cls, message


def _transformers_refuses(path: Path) -> str:
    """transformers' own refusal of the config (what lightprune restates): its config class raises."""
    from huggingface_hub.errors import StrictDataclassFieldValidationError
    from transformers import AutoConfig

    with pytest.raises(StrictDataclassFieldValidationError) as err:
        AutoConfig.from_pretrained(path)
    return str(err.value)


_INTEGER = "where transformers' {cls} takes an integer; write {what}"
_DIGITS = "the model's {key} as an integer (digits only: no decimal point, not true or false)"

#: name -> (which clean checkpoint, the damage, the key as named, the value as config.json writes it, its kind,
#: transformers' config class, what to write, whether transformers itself refuses it)
INTEGER_FIELDS = {
    "a count as 8.0": ("single", _config(num_experts=8.0), "num_experts", "8.0", "a number with a decimal point",
                       "Qwen3MoeConfig", "8", True),
    "top-k as true": ("single", _config(num_experts_per_tok=True), "num_experts_per_tok", "true", "a boolean",
                      "Qwen3MoeConfig", _DIGITS.format(key="num_experts_per_tok"), True),
    "a size as 32.5": ("single", _config(hidden_size=32.5), "hidden_size", "32.5", "a number with a decimal point",
                       "Qwen3MoeConfig", _DIGITS.format(key="hidden_size"), True),
    "layers as 3.0": ("single", _config(num_hidden_layers=3.0), "num_hidden_layers", "3.0",
                      "a number with a decimal point", "Qwen3MoeConfig", "3", True),
    "an optional id as false": ("single", _config(pad_token_id=False), "pad_token_id", "false", "a boolean",
                                "Qwen3MoeConfig", _DIGITS.format(key="pad_token_id"), True),
    "a vision tower's depth as 2.0": ("mllm", lambda p: _edit_vision(p, depth=2.0), "vision_config.depth", "2.0",
                                      "a number with a decimal point", "Qwen3VLMoeVisionConfig", "2", True),
    # the attribute the field num_experts stands for (attribute_map): what config.json holds and lightprune reads;
    # transformers checks a value by the name it is set under only, and would build 8.0 experts
    "the stored expert count as 8.0": ("single", _config(num_local_experts=8.0), "num_local_experts", "8.0",
                                       "a number with a decimal point", "Qwen3MoeConfig", "8", False),
}


def test_a_float_field_holding_an_integer_is_one_line_saying_what_to_write(clean, tmp_path):
    """transformers refuses ``"rms_norm_eps": 1`` (an int where its field is a float) as it refuses 8.0 for a count."""
    path, error, message = _one_refusal(clean, tmp_path, "single", _config(rms_norm_eps=1))
    assert (error, message) == (ValueError, f"checkpoint {str(path)!r}: config.json's rms_norm_eps is 1, an integer "
                                            "where transformers' Qwen3MoeConfig takes a number with a decimal point; "
                                            "write 1.0")
    assert "expected float, got int" in _transformers_refuses(path)


@pytest.mark.parametrize("case", list(INTEGER_FIELDS))
def test_an_integer_field_holding_a_decimal_or_a_boolean_is_one_line_naming_config_json_on_every_path(
        clean, tmp_path, case):
    from transformers import AutoConfig, Qwen3MoeConfig

    which, damage, name, shown, kind, cls, what, refused = INTEGER_FIELDS[case]
    path, error, message = _one_refusal(clean, tmp_path, which, damage)
    assert (error, message) == (ValueError, f"checkpoint {str(path)!r}: config.json's {name} is {shown}, {kind} "
                                            + _INTEGER.format(cls=cls, what=what))
    if refused:
        assert f"expected int, got {'bool' if kind == 'a boolean' else 'float'}" in _transformers_refuses(path)
    else:  # the field it stands for is an int; the config transformers builds holds the float
        assert Qwen3MoeConfig.attribute_map == {"num_experts": name}
        assert Qwen3MoeConfig.__dataclass_fields__["num_experts"].type is int
        assert AutoConfig.from_pretrained(path).num_experts == 8.0


def test_a_field_of_another_type_is_refused_as_transformers_refuses_it(clean, tmp_path):
    path, error, message = _one_refusal(clean, tmp_path, "single", _config(hidden_size="32"))
    cause = "Field 'hidden_size' expected int, got str (value: '32')"
    assert (error, message) == (ValueError, f"checkpoint {str(path)!r}: config.json's hidden_size is \"32\", not what "
                                            f"transformers' Qwen3MoeConfig takes there ({cause}); write a value of the "
                                            "field's type (int)")
    assert cause in _transformers_refuses(path)


def test_values_transformers_takes_are_not_refused(clean, tmp_path):
    """An integer where the field takes either, a float transformers writes as {"__float__": ...}, null where the field
    may be None: accepted alike, as transformers accepts them; the loaded model's tensors are the checkpoint's."""
    model, dirs = clean
    path = tmp_path / "ckpt"
    shutil.copytree(dirs["single"], path)
    _config(attention_dropout=0, router_aux_loss_coef={"__float__": "Infinity"}, sliding_window=None)(path)
    loaded = lp.load_pruned(path)
    assert loaded.config.attention_dropout == 0 and loaded.config.router_aux_loss_coef == math.inf
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())
    expected, got = lp.score_weights(model, "aimer"), lp.score_weights(path, "aimer", progress=False)
    assert all(torch.equal(got.raw[i], expected.raw[i]) for i in expected.raw)


@pytest.mark.parametrize("value, hint", [("QWEN3_MOE", " (did you mean 'qwen3_moe'?)"),
                                         ("qwen3moe", " (did you mean 'qwen3_moe'?)"),
                                         ("no_such_model_family", "")])
def test_an_unknown_model_type_is_one_line_with_the_close_known_name_on_every_path(clean, tmp_path, value, hint):
    from transformers import CONFIG_MAPPING

    path, error, message = _one_refusal(clean, tmp_path, "single", _config(model_type=value))
    assert (error, message) == (ValueError, f"checkpoint {str(path)!r}: config.json's model_type is \"{value}\", a "
                                            f"model type transformers does not know{hint}; write the model type of "
                                            "the checkpoint's architecture (transformers' CONFIG_MAPPING lists the "
                                            f"{len(CONFIG_MAPPING.keys())} it knows)")


def test_a_model_type_that_is_no_string_is_refused_naming_it(clean, tmp_path):
    path, error, message = _one_refusal(clean, tmp_path, "single", _config(model_type=["qwen3_moe"]))
    assert (error, message) == (ValueError, f"checkpoint {str(path)!r}: config.json's model_type is [\"qwen3_moe\"], "
                                            "not a model type name; write the model type of the checkpoint's "
                                            "architecture (a string such as \"qwen3_moe\": transformers' "
                                            "CONFIG_MAPPING lists the ones it knows)")


def test_a_sub_configs_model_type_and_fields_are_checked_by_the_class_transformers_builds(tmp_path):
    """A composite config whose sub-config transformers builds by its model_type (InternVL's text_config): an unknown
    one is named with its path; one whose class transformers fixes (Qwen3-VL-MoE's) is left alone, as transformers
    leaves it, and the fields are checked by that class."""
    from transformers import CONFIG_MAPPING

    from lightprune.checkpoints.strict import check_config_values

    known = len(CONFIG_MAPPING.keys())
    with pytest.raises(ValueError) as err:
        check_config_values(tmp_path, {"model_type": "internvl", "text_config": {"model_type": "Qwen3_Moe"}})
    assert str(err.value) == (f"checkpoint {str(tmp_path)!r}: config.json's text_config.model_type is \"Qwen3_Moe\", "
                              "a model type transformers does not know (did you mean 'qwen3_moe'?); write the model "
                              f"type of the checkpoint's architecture (transformers' CONFIG_MAPPING lists the {known} "
                              "it knows)")
    with pytest.raises(ValueError) as err:
        check_config_values(tmp_path, {"model_type": "internvl", "text_config": {"model_type": "qwen3_moe",
                                                                                 "num_experts": 4.0}})
    assert str(err.value) == (f"checkpoint {str(tmp_path)!r}: config.json's text_config.num_experts is 4.0, a number "
                              "with a decimal point " + _INTEGER.format(cls="Qwen3MoeConfig", what="4"))
    check_config_values(tmp_path, {"model_type": "qwen3_vl_moe", "text_config": {"model_type": "anything"}})


# ----------------------------------------------------------------------------------- the shard index's metadata
def _index_file(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        index = json.loads((path / "model.safetensors.index.json").read_text())
        edit(index)
        (path / "model.safetensors.index.json").write_text(json.dumps(index))
    return damage


@pytest.mark.parametrize("metadata", ["absent", None, [], "x"])
def test_a_shard_index_without_a_metadata_object_is_refused_on_every_path(clean, tmp_path, metadata):
    """transformers' loader reads index["metadata"] and adds keys to it (a bare KeyError or TypeError there): every
    path refuses such an index up front, naming it and what to write."""
    from transformers.utils.hub import get_checkpoint_shard_files

    edit = (lambda index: index.pop("metadata")) if metadata == "absent" else \
        (lambda index: index.update(metadata=metadata))
    path, error, message = _one_refusal(clean, tmp_path, "sharded", _index_file(edit))
    index = str(path / "model.safetensors.index.json")
    expected = (f"shard index {index!r} has no \"metadata\": transformers' loader reads it, so it cannot load the "
                "folder as it is; add \"metadata\": {} to the index") if metadata == "absent" else \
        (f"shard index {index!r} has \"metadata\": {json.dumps(metadata)}, not a JSON object: transformers' loader "
         "adds its own keys to it, so it cannot load the folder as it is; make it an object (\"metadata\": {} if "
         "there is nothing to say)")
    assert (error, message) == (ValueError, expected)
    with pytest.raises((KeyError, TypeError)):  # what transformers itself does with it
        get_checkpoint_shard_files(str(path), index)


def test_a_shard_index_with_empty_metadata_is_read_as_transformers_reads_it(clean, tmp_path):
    model, dirs = clean
    path = tmp_path / "ckpt"
    shutil.copytree(dirs["sharded"], path)
    _index_file(lambda index: index.update(metadata={}))(path)
    loaded = lp.load_pruned(path)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())
    expected, got = lp.score_weights(model, "aimer"), lp.score_weights(path, "aimer", progress=False)
    assert all(torch.equal(got.raw[i], expected.raw[i]) for i in expected.raw)


def _no_config_dtype(metadata_dtype) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        config = json.loads((path / "config.json").read_text())
        config.pop("dtype", None)
        (path / "config.json").write_text(json.dumps(config))
        _index_file(lambda index: index["metadata"].update(dtype=metadata_dtype))(path)
    return damage


def test_the_shard_index_dtype_transformers_loads_in_without_a_config_dtype_must_be_the_stored_one(clean, tmp_path):
    """Without a config.json dtype, transformers loads the model in the index metadata's (bfloat16 here), the streamed
    paths compute in the stored one (float32): every path refuses that, naming both."""
    from transformers import AutoModelForCausalLM

    path, error, message = _one_refusal(clean, tmp_path, "sharded", _no_config_dtype("bfloat16"))
    assert (error, message) == (ValueError, f"checkpoint {str(path)!r}: its shard index's \"metadata\" says dtype "
                                            "bfloat16 (config.json names none), its weights are stored in float32 "
                                            "(100% of the tensor bytes): loaded whole it would compute in bfloat16, "
                                            "streamed in float32; set \"dtype\": \"float32\" in config.json (or "
                                            "re-save the checkpoint in the dtype it names)")
    loaded = AutoModelForCausalLM.from_pretrained(path, dtype="auto")  # what transformers does with the folder
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}


def test_without_any_dtype_named_the_first_floating_tensors_must_be_the_stored_one(clean, tmp_path):
    """Nothing names a dtype: transformers loads the model in its first floating tensor's (lm_head.weight, float32
    here), the streamed paths in the one of most bytes (bfloat16): every path refuses that, naming the tensor."""
    from transformers import AutoModelForCausalLM

    def damage(path: Path) -> None:
        tensors = load_file(path / "model.safetensors")
        tensors = {k: v if k == "lm_head.weight" else v.to(torch.bfloat16) for k, v in tensors.items()}
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
        config = json.loads((path / "config.json").read_text())
        config.pop("dtype")
        (path / "config.json").write_text(json.dumps(config))

    path, error, message = _one_refusal(clean, tmp_path, "single", damage)
    tensors = load_file(path / "model.safetensors")
    bf16 = sum(t.numel() * 2 for t in tensors.values() if t.dtype == torch.bfloat16)
    share = bf16 / (bf16 + tensors["lm_head.weight"].numel() * 4)
    assert (error, message) == (ValueError, f"checkpoint {str(path)!r}: config.json names no dtype, so transformers "
                                            "loads the model in float32, the dtype of the first floating tensor of "
                                            "model.safetensors (lm_head.weight), its weights are stored in bfloat16 "
                                            f"({share:.0%} of the tensor bytes): loaded whole it would compute in "
                                            "float32, streamed in bfloat16; set \"dtype\": \"bfloat16\" in "
                                            "config.json (or re-save the checkpoint in the dtype it names)")
    loaded = AutoModelForCausalLM.from_pretrained(path, dtype="auto")  # what transformers does with the folder
    assert loaded.model.layers[0].mlp.experts.gate_up_proj.dtype == torch.float32


def test_a_shard_index_dtype_that_names_no_dtype_is_refused(clean, tmp_path):
    path, error, message = _one_refusal(clean, tmp_path, "sharded", _no_config_dtype("float33"))
    assert (error, message) == (ValueError, f"checkpoint {str(path)!r}: its shard index's \"metadata\" has "
                                            "\"dtype\": \"float33\", not a torch dtype name, which transformers loads "
                                            "the model in when config.json names none; set \"dtype\": \"float32\" in "
                                            "config.json (transformers reads it first)")


def test_a_shard_index_dtype_that_is_the_stored_one_is_accepted_alike(clean, tmp_path):
    model, dirs = clean
    path = tmp_path / "ckpt"
    shutil.copytree(dirs["sharded"], path)
    _no_config_dtype("float32")(path)
    loaded = lp.load_pruned(path)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())
    expected, got = lp.score_weights(model, "aimer"), lp.score_weights(path, "aimer", progress=False)
    assert all(torch.equal(got.raw[i], expected.raw[i]) for i in expected.raw)


# ----------------------------------------------------------------------------------- the files an export copies along
def _not_a_file(name: str, how: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        (path / name).parent.mkdir(exist_ok=True)
        (path / name).unlink(missing_ok=True)
        if how == "a directory":
            (path / name).mkdir()
        elif how == "a dangling symlink":
            (path / name).symlink_to(path / "gone.json")
        else:
            os.mkfifo(path / name)
    return damage


_COPIED = "an export copies it along (the tokenizer, processor and chat-template files, generation_config.json) and " \
          "would lack it; restore the file (or remove the name)"
COPIED_FILES = {
    "tokenizer_config.json a directory": ("tokenizer_config.json", "a directory", IsADirectoryError,
                                          "is a directory, not a file"),
    "tokenizer.json a named pipe": ("tokenizer.json", "a named pipe", ValueError, "is not a regular file (a FIFO)"),
    "special_tokens_map.json a directory": ("special_tokens_map.json", "a directory", IsADirectoryError,
                                            "is a directory, not a file"),
    "generation_config.json a dangling symlink": ("generation_config.json", "a dangling symlink", FileNotFoundError,
                                                  "is a dangling symlink (its target {gone!r} does not exist)"),
    "a named chat template a directory": ("additional_chat_templates/tool_use.jinja", "a directory",
                                         IsADirectoryError, "is a directory, not a file"),
}


@pytest.mark.parametrize("case", list(COPIED_FILES))
def test_a_file_an_export_copies_that_is_no_regular_file_is_refused_on_every_path(clean, tmp_path, case):
    name, how, cls, why = COPIED_FILES[case]
    path, error, message = _one_refusal(clean, tmp_path, "single", _not_a_file(name, how))
    why = why.format(gone=str(path / "gone.json"))
    assert (error, message) == (cls, f"checkpoint directory {str(path)!r}: its {name} {why}; {_COPIED}")


def test_a_model_loaded_elsewhere_is_refused_by_the_export_before_anything_changes(clean, tmp_path):
    """A model transformers loaded from the folder (not lp.load_pruned): export_pruned and save_pruned refuse its
    source's broken tokenizer file before any surgery or write, with the message every path gives."""
    from transformers import AutoModelForCausalLM

    model, dirs = clean
    path = tmp_path / "ckpt"
    shutil.copytree(dirs["single"], path)
    _not_a_file("tokenizer_config.json", "a directory")(path)
    loaded = AutoModelForCausalLM.from_pretrained(path)
    expected = (f"checkpoint directory {str(path.absolute())!r}: its tokenizer_config.json is a directory, not a "
                f"file; {_COPIED}")
    before = {k: v.clone() for k, v in loaded.state_dict().items()}
    for call in (lambda: lp.export_pruned(loaded, _plan(model), tmp_path / "out"),
                 lambda: lp.save_pruned(loaded, tmp_path / "out"),
                 lambda: lp.save_pruned(model, tmp_path / "out", source_dir=path)):
        with pytest.raises(IsADirectoryError) as err:
            call()
        assert str(err.value) == expected
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))
    assert loaded.state_dict().keys() == before.keys()
    assert all(torch.equal(v, before[k]) for k, v in loaded.state_dict().items())  # not pruned

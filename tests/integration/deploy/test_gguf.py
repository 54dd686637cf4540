"""A uniform export of the micro text testbed through llama.cpp's own GGUF converter (scripts/convert_to_gguf.py),
its GGUF read back with gguf-py from the package index and compared, tensor by tensor and field by field, with the
checkpoint and its tokenizer. No network: the converter is fetched beforehand (scripts/fetch_llama_cpp.py, which
the README's test command runs); without it these tests skip, and fail under CI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import lightprune as lp
from lightprune.testbed import resolve_testbed

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
from fetch_llama_cpp import converter_dir


def _need(ok: bool, why: str) -> None:
    if not ok:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(why)


@pytest.fixture(scope="module")
def gguf():
    try:
        import gguf
    except ImportError:
        _need(False, "gguf-py is not installed (pip install -e '.[deploy]'; the dev extra brings it)")
    _need((converter_dir() / "convert_hf_to_gguf.py").is_file(),
          f"llama.cpp's converter is not in {converter_dir()}: run `python scripts/fetch_llama_cpp.py`")
    return gguf


def _convert(export: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "scripts" / "convert_to_gguf.py"), str(export), str(out), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def _export(testbed_root: Path, out: Path, uniform: bool = True):
    from transformers import AutoTokenizer

    source = resolve_testbed("testbed:text-micro", testbed_root)
    model = lp.load_pruned(source)
    plan = lp.select_experts(lp.score_weights(model, "aimer"), ratio=0.5, allocation="uniform")
    if not uniform:  # one expert more in the first layer, one fewer in the last
        first, last = min(plan.keep), max(plan.keep)
        spare = [e for e in range(plan.num_experts[first]) if e not in plan.keep[first]]
        keep = {**plan.keep, first: sorted([*plan.keep[first], spare[0]]), last: plan.keep[last][:-1]}
        plan = lp.ExpertPlan(keep=keep, num_experts=plan.num_experts, criterion="aimer")
    tokenizer = AutoTokenizer.from_pretrained(source)
    result = lp.export_pruned(model, plan, out, processor=tokenizer, source_dir=source)
    return SimpleNamespace(path=result.path, source=source, plan=plan, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def uniform(gguf, testbed_root, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gguf")
    export = _export(testbed_root, tmp / "export")
    export.done = _convert(export.path, tmp / "model.gguf")
    assert export.done.returncode == 0, export.done.stderr[-3000:]
    export.reader = gguf.GGUFReader(tmp / "model.gguf")
    return export


def _gguf_names(layer: int) -> dict[str, str]:
    """llama.cpp's name of each Qwen3-MoE decoder-layer tensor (gguf-py's tensor_mapping, written out)."""
    hf = f"model.layers.{layer}."
    return {f"blk.{layer}.attn_norm.weight": hf + "input_layernorm.weight",
            f"blk.{layer}.attn_q.weight": hf + "self_attn.q_proj.weight",
            f"blk.{layer}.attn_k.weight": hf + "self_attn.k_proj.weight",
            f"blk.{layer}.attn_v.weight": hf + "self_attn.v_proj.weight",
            f"blk.{layer}.attn_output.weight": hf + "self_attn.o_proj.weight",
            f"blk.{layer}.attn_q_norm.weight": hf + "self_attn.q_norm.weight",
            f"blk.{layer}.attn_k_norm.weight": hf + "self_attn.k_norm.weight",
            f"blk.{layer}.ffn_norm.weight": hf + "post_attention_layernorm.weight",
            f"blk.{layer}.ffn_gate_inp.weight": hf + "mlp.gate.weight"}


def _expert_names(layer: int, experts: int) -> dict[str, list[str]]:
    """llama.cpp's stacked expert tensors: [E, out, in], expert j from the checkpoint's ``experts.j`` (transformers
    writes a Qwen3-MoE checkpoint's fused experts one per expert)."""
    hf = f"model.layers.{layer}.mlp.experts."
    return {f"blk.{layer}.ffn_{part}_exps.weight": [f"{hf}{j}.{part}_proj.weight" for j in range(experts)]
            for part in ("gate", "up", "down")}


def test_every_tensor_of_the_gguf_is_the_checkpoints(uniform) -> None:
    plan = uniform.plan
    state = load_file(uniform.path / "model.safetensors")
    config = json.loads((uniform.path / "config.json").read_text())
    got = {t.name: torch.from_numpy(t.data.copy()) for t in uniform.reader.tensors}
    want = {"token_embd.weight": state["model.embed_tokens.weight"], "output_norm.weight": state["model.norm.weight"],
            "output.weight": state["lm_head.weight"]}
    used = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for layer in range(config["num_hidden_layers"]):
        names = _gguf_names(layer)
        want.update({name: state[key] for name, key in names.items()})
        experts = _expert_names(layer, len(plan.keep[layer]))
        want.update({name: torch.stack([state[key] for key in keys]) for name, keys in experts.items()})
        used |= set(names.values()) | {key for keys in experts.values() for key in keys}
    assert sorted(got) == sorted(want)  # nothing more, nothing less
    for name, tensor in want.items():
        assert got[name].dtype == torch.float32 and torch.equal(got[name], tensor), name
    assert used == set(state)  # every tensor of the checkpoint went into the GGUF, once


def test_the_gguf_model_and_tokenizer_fields(uniform) -> None:
    from transformers import AutoConfig

    plan, tokenizer = uniform.plan, uniform.tokenizer
    config, source = AutoConfig.from_pretrained(uniform.path), AutoConfig.from_pretrained(uniform.source)
    field = {name: f.contents() for name, f in uniform.reader.fields.items() if not name.startswith("GGUF.")}
    kept = {len(ids) for ids in plan.keep.values()}
    assert field["general.architecture"] == "qwen3moe" and len(kept) == 1
    assert field["qwen3moe.expert_count"] == kept.pop() == config.num_experts < source.num_experts
    assert field["qwen3moe.expert_used_count"] == config.num_experts_per_tok
    assert field["qwen3moe.block_count"] == config.num_hidden_layers
    assert field["qwen3moe.expert_feed_forward_length"] == config.moe_intermediate_size
    # the tokenizer: the mapping the converter was given, and the vocabulary, merges and specials as they are
    assert field["tokenizer.ggml.model"] == "gpt2" and field["tokenizer.ggml.pre"] == "gpt-2"
    assert "tokenizer.ggml.pre = 'gpt-2'" in uniform.done.stderr
    assert field["tokenizer.ggml.tokens"] == tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    merges = json.loads((uniform.path / "tokenizer.json").read_text())["model"]["merges"]
    assert field["tokenizer.ggml.merges"] == [m if isinstance(m, str) else " ".join(m) for m in merges]
    assert field["tokenizer.ggml.bos_token_id"] == tokenizer.bos_token_id
    assert field["tokenizer.ggml.eos_token_id"] == tokenizer.eos_token_id
    assert field["tokenizer.chat_template"] == tokenizer.chat_template


def test_without_the_mapping_the_converter_refuses_the_testbed_tokenizer(uniform, tmp_path) -> None:
    done = _convert(uniform.path, tmp_path / "model.gguf", "--pre-tokenizer", "none")
    assert done.returncode != 0 and "BPE pre-tokenizer was not recognized" in done.stderr
    assert list(tmp_path.iterdir()) == []  # no GGUF, no partial file


def test_a_non_uniform_export_is_refused_naming_its_counts(gguf, testbed_root, tmp_path) -> None:
    export = _export(testbed_root, tmp_path / "export", uniform=False)
    counts = {str(layer): len(ids) for layer, ids in export.plan.keep.items()}
    assert json.loads((export.path / "lightprune_export.json").read_text())["experts_per_layer"] == counts
    done = _convert(export.path, tmp_path / "model.gguf")
    assert done.returncode != 0 and not (tmp_path / "model.gguf").exists()
    assert f"keeps different numbers of experts per layer ({counts})" in done.stderr


@pytest.mark.parametrize(("change", "gpt2"), [
    ({}, True),
    ({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "use_regex": True}}, False),
    ({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}}, False),
    ({"pre_tokenizer": {"type": "Metaspace"}}, False),
    ({"normalizer": {"type": "NFC"}}, False),
])
def test_auto_names_gpt2_only_for_gpt2_byte_level_pre_tokenization(tmp_path, change, gpt2) -> None:
    from convert_to_gguf import gpt2_byte_level

    from lightprune.data import train_bpe_tokenizer

    train_bpe_tokenizer(["a few words", "and some more"] * 4, 300).save_pretrained(tmp_path)
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    (tmp_path / "tokenizer.json").write_text(json.dumps({**spec, **change}))
    assert gpt2_byte_level(tmp_path / "tokenizer.json") is gpt2

"""A uniform export of the micro text testbed through llama.cpp's own GGUF converter, by the command the deployment
page shows (``lightprune convert-gguf``, run from a copy of what the page needs of the repository root), its GGUF
read back with gguf-py from the package index and compared, tensor by tensor and field by field, with the checkpoint
and its tokenizer; then, in this process, the converter's own lists, its refusal of an unknown tokenizer (the step
named), the weight files it reads (its own index_tensors), a full disk mid-write, a write cut short by a file size
limit and a verbose run. No network: the converter is fetched beforehand (scripts/fetch_llama_cpp.py, which the
README's test command runs); without it these tests skip, and fail under CI. The refusals on a stand-in converter:
tests/unit/export/test_gguf_export.py."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fixtures.deploy import export_testbed, page_commands
from safetensors.torch import load_file

from lightprune.checkpoints import OutputDirError
from lightprune.export import MANIFEST_FILE, gguf as gguf_module
from lightprune.export.gguf import (
    GGUFConversionError,
    convert_to_gguf,
    converter_dir,
    converter_module,
    converter_outtypes,
    converter_pre_tokenizers,
    find_converter,
)

pytestmark = pytest.mark.exhaustive  # the exhaustive tier only: llama.cpp's converter (test_gguf_export.py: in process)


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


@pytest.fixture
def unconverted(monkeypatch):
    """Importing llama.cpp's converter fails the test: a refusal must come before it."""
    def imported(folder):
        raise AssertionError(f"the converter in {folder} was imported")

    monkeypatch.setattr(gguf_module.converter, "_load_converter", imported)


@pytest.fixture(scope="module")
def uniform(gguf, testbed_root, tmp_path_factory):
    """The page's ``lightprune convert-gguf`` command, run as the console script runs it from a folder holding what
    the page needs of the repository root: the export at the path it names."""
    root = tmp_path_factory.mktemp("checkout")
    (words,) = [w for w in page_commands() if w[:2] == ["lightprune", "convert-gguf"]]
    export = export_testbed(testbed_root, root / words[2])
    cmd = [sys.executable, "-m", "lightprune.cli.command", *words[1:]]
    export.done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=False,
                                 env={**os.environ, "HF_HUB_OFFLINE": "1", "LIGHTPRUNE_VERBOSE": "0"})
    assert export.done.returncode == 0, export.done.stderr[-3000:]
    export.gguf = root / words[3]
    export.reader = gguf.GGUFReader(export.gguf)
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
    assert field["tokenizer.ggml.tokens"] == tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    merges = json.loads((uniform.path / "tokenizer.json").read_text())["model"]["merges"]
    assert field["tokenizer.ggml.merges"] == [m if isinstance(m, str) else " ".join(m) for m in merges]
    assert field["tokenizer.ggml.bos_token_id"] == tokenizer.bos_token_id
    assert field["tokenizer.ggml.eos_token_id"] == tokenizer.eos_token_id
    assert field["tokenizer.chat_template"] == tokenizer.chat_template


def test_the_command_is_quiet_and_names_the_gguf_it_wrote(uniform) -> None:
    """No INFO line, no converter warning, no progress bar: one line naming the GGUF (never its staged file), its
    size, its tensor count and the pre-tokenizer named; nothing staged is left beside it."""
    path = uniform.gguf
    assert uniform.done.stderr == ""
    assert re.fullmatch(rf"wrote {re.escape(str(path))} \({path.stat().st_size:,} bytes, "
                        rf"{len(uniform.reader.tensors)} tensors, outtype f32; tokenizer.ggml.pre 'gpt-2' named here, "
                        r"llama.cpp does not know this tokenizer\) in \d+\.\d s\n", uniform.done.stdout)
    assert sorted(p.name for p in path.parent.iterdir()) == ["quickstart", path.name]


def test_the_choices_are_the_converters_own(gguf, monkeypatch) -> None:
    """The outtypes read from the converter's source are its parser's choices; the pre-tokenizer names are those its
    fingerprints and its models name (the testbed's gpt-2 among them)."""
    folder = find_converter()
    parsers = []

    def captured(self, *args, **kwargs):
        parsers.append(self)
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", captured)
    with converter_module(folder) as converter, pytest.raises(SystemExit):
        converter.parse_args()
    (outtype,) = [action for action in parsers[0]._actions if "--outtype" in action.option_strings]
    assert converter_outtypes(folder) == tuple(outtype.choices) and "f32" in outtype.choices
    names = converter_pre_tokenizers(folder)
    assert {"gpt-2", "llama-bpe", "qwen2", "default"} <= set(names) and len(names) > 50


def test_an_unknown_outtype_or_pre_tokenizer_is_refused_before_the_converter(uniform, tmp_path, unconverted) -> None:
    folder = str(find_converter())
    with pytest.raises(ValueError) as raised:
        convert_to_gguf(uniform.path, tmp_path / "model.gguf", outtype="f64")
    assert str(raised.value) == (f"outtype 'f64' is not one of the --outtype choices of llama.cpp's converter in "
                                 f"{folder!r}; did you mean 'f16'?")
    with pytest.raises(ValueError) as raised:
        convert_to_gguf(uniform.path, tmp_path / "model.gguf", pre_tokenizer="gpt2")
    assert str(raised.value).startswith(f"pre-tokenizer 'gpt2' is not one llama.cpp knows (the names its converter in "
                                        f"{folder!r} writes as tokenizer.ggml.pre); did you mean 'gpt-2'")
    assert list(tmp_path.iterdir()) == []


def test_without_the_mapping_the_converter_refuses_the_testbed_tokenizer(uniform, tmp_path, capfd) -> None:
    with pytest.raises(GGUFConversionError) as raised:
        convert_to_gguf(uniform.path, tmp_path / "model.gguf", pre_tokenizer="none")
    assert str(raised.value) == (f"llama.cpp's converter failed on {str(uniform.path)!r} while reading the tokenizer "
                                 "(set_vocab): NotImplementedError: BPE pre-tokenizer was not recognized - update "
                                 "get_vocab_base_pre(); name the tokenizer's pre-tokenizer with --pre-tokenizer NAME "
                                 "(pre_tokenizer=NAME)")
    assert list(tmp_path.iterdir()) == []  # no GGUF, no partial file
    assert capfd.readouterr() == ("", "")  # nor the converter's banner about it


def test_the_weight_files_refused_are_those_the_converters_index_tensors_reads(gguf, tmp_path) -> None:
    """converter_weight_files is the pinned converter's own rule (its ModelBase.index_tensors, run here on folders
    of empty files with the files it opens recorded): every model*.safetensors without a shard index, the index's
    files with one, pickles only without safetensors."""
    layouts = {"strays": ["model.safetensors", "model_backup.safetensors", "model-00001-of-00002.safetensors",
                          "model.safetensors.bak", "adapter_model.safetensors", "pytorch_model.bin"],
               "indexed": ["model.safetensors.index.json", "model-00001-of-00001.safetensors",
                           "model_backup.safetensors"],
               "pickles": ["pytorch_model.bin", "pytorch_model-00002.bin", "model.bin"]}
    with converter_module(find_converter()) as converter:
        opened = []

        class Recorded(contextlib.nullcontext):
            def __init__(self, path) -> None:
                opened.append(Path(path).name)
                super().__init__({"a": None})  # the tensor the index lists

        utility = converter.gguf.utility
        for name, files in layouts.items():
            folder = tmp_path / name
            folder.mkdir()
            for file in files:
                (folder / file).write_bytes(b"")
            if "model.safetensors.index.json" in files:
                (folder / "model.safetensors.index.json").write_text(json.dumps(
                    {"weight_map": {"a": "model-00001-of-00001.safetensors"}}))
            model = argparse.Namespace(dir_model=folder, is_mistral_format=False, lazy=True,
                                       filter_tensors=lambda item: item)
            opened.clear()
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(utility, "SafetensorsLocal", Recorded)
                patch.setattr(converter.torch, "load", lambda path, **kwargs: opened.append(Path(path).name) or {})
                converter.ModelBase.index_tensors(model)
            assert sorted(opened) == gguf_module.converter_weight_files(folder), name
    assert gguf_module.converter_weight_files(tmp_path / "strays") == [
        "model-00001-of-00002.safetensors", "model.safetensors", "model_backup.safetensors"]


def test_a_write_that_stops_short_is_one_line_and_leaves_nothing(uniform, tmp_path) -> None:
    """A file-size limit below the GGUF's size (SIGXFSZ ignored: writes past it fail as on a full disk, numpy's
    ``tofile`` with "N requested and M written" and no errno): one line naming the GGUF, nothing left behind."""
    import resource
    import signal

    out, limit = tmp_path / "model.gguf", uniform.gguf.stat().st_size * 3 // 4

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run([sys.executable, "-m", "lightprune.cli.command", "convert-gguf", str(uniform.path),
                           str(out)], capture_output=True, text=True, check=False, preexec_fn=limited,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "LIGHTPRUNE_VERBOSE": "0"})
    assert done.returncode == 2 and done.stdout == "", done.stderr[-3000:]
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("lightprune: error: "), done.stderr[-3000:]
    assert f"{str(out)!r}" in done.stderr and f"nothing was written, {str(out)!r} was not created" in done.stderr
    assert "requested and" not in done.stderr or "converter could not write the GGUF" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_non_uniform_export_is_refused_naming_its_counts(gguf, testbed_root, tmp_path, unconverted) -> None:
    export = export_testbed(testbed_root, tmp_path / "export", uniform=False)
    counts = {layer: len(ids) for layer, ids in export.plan.keep.items()}
    assert json.loads((export.path / MANIFEST_FILE).read_text())["experts_per_layer"] == \
        {str(layer): n for layer, n in counts.items()}
    with pytest.raises(ValueError) as raised:
        convert_to_gguf(export.path, tmp_path / "model.gguf")
    assert str(raised.value).startswith(f"export {str(export.path)!r} keeps different numbers of experts per layer "
                                        f"({counts}); GGUF stores one expert count for the whole model")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_a_full_disk_mid_write_leaves_nothing_behind_and_the_output_as_it_was(uniform, tmp_path, monkeypatch) -> None:
    with converter_module(find_converter()) as converter:  # its own gguf-py's writer, the one a conversion uses
        writer = converter.gguf.GGUFWriter
    out, staged = tmp_path / "model.gguf", []
    out.write_bytes(b"the previous GGUF")

    def full(self, *, progress: bool = False) -> None:
        self.write_ti_data_to_file()  # the header, the metadata and the tensor infos are on disk by now
        self.fout[0].flush()
        staged.append((Path(self.fout[0].name), Path(self.fout[0].name).stat().st_size))
        raise OSError(errno.ENOSPC, "No space left on device", self.fout[0].name)

    monkeypatch.setattr(writer, "write_tensors_to_file", full)
    with pytest.raises(OutputDirError) as raised:
        convert_to_gguf(uniform.path, out, overwrite=True)
    assert str(raised.value) == (f"no space left on the device holding {str(out)!r}; nothing was written, "
                                 f"{str(out)!r} is as it was")
    [(partial, size)] = staged
    assert partial.parent == tmp_path and partial.name.startswith(".model.gguf.lightprune-tmp-") and size > 1000
    assert out.read_bytes() == b"the previous GGUF" and [p.name for p in tmp_path.iterdir()] == ["model.gguf"]


def test_a_verbose_conversion_in_python_shows_the_converter_and_writes_the_same_gguf(uniform, tmp_path, monkeypatch,
                                                                                     caplog) -> None:
    monkeypatch.setenv("LIGHTPRUNE_VERBOSE", "1")
    caplog.set_level(logging.INFO)
    result = convert_to_gguf(uniform.path, tmp_path / "model.gguf")
    said = [record.getMessage() for record in caplog.records if record.name == "hf-to-gguf"]
    assert "Model architecture: Qwen3MoeForCausalLM" in said and any("successfully exported" in m for m in said)
    assert (result.path, result.tensors, result.pre_tokenizer) == (tmp_path / "model.gguf",
                                                                  len(uniform.reader.tensors), "gpt-2")
    assert result.path.read_bytes() == uniform.gguf.read_bytes()  # the command's GGUF, byte for byte
    assert [p.name for p in tmp_path.iterdir()] == ["model.gguf"]


def test_a_q8_0_conversion_holds_the_checkpoints_tensors_within_q8_0s_rounding(uniform, gguf, tmp_path) -> None:
    """``outtype="q8_0"`` (the converter's own choice): the matrices the converter quantizes are stored
    Q8_0 (per block of 32 an fp16 scale and int8 values); read back with gguf-py's own dequantization, each value is
    its checkpoint value within half a step of its block (step = amax / 127; the step stored in fp16, whose rounding,
    2^-11 of it, moves the block's largest value by up to 127 of that); the rest as in the f32 conversion."""
    from gguf.quants import dequantize

    result = convert_to_gguf(uniform.path, tmp_path / "model-q8_0.gguf", outtype="q8_0")
    assert result.outtype == "q8_0" and result.tensors == len(uniform.reader.tensors)
    f32 = {t.name: torch.from_numpy(t.data.copy()) for t in uniform.reader.tensors}
    quantized = 0
    for tensor in gguf.GGUFReader(result.path).tensors:
        want = f32[tensor.name]
        if tensor.tensor_type != gguf.GGMLQuantizationType.Q8_0:  # F32, or F16 where rows do not split into 32s
            got = torch.from_numpy(tensor.data.copy()).reshape(want.shape)
            assert got.dtype in (torch.float32, torch.float16) and torch.equal(got, want.to(got.dtype)), tensor.name
            continue
        quantized += 1
        got = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy()).reshape(want.shape)
        blocks = want.float().reshape(-1, 32)
        step = blocks.abs().amax(dim=1, keepdim=True) / 127
        assert ((got.reshape(-1, 32) - blocks).abs() <= step * (0.5 + 127 * 2.0 ** -11) + 1e-7).all(), tensor.name
    assert quantized >= 2 * int(json.loads((uniform.path / "config.json").read_text())["num_hidden_layers"])
    assert result.size < uniform.gguf.stat().st_size / 2  # 8.5 bits a weight (16 where F16) against 32, and the vocabulary

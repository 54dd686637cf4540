"""lightprune convert-gguf (lightprune.export.gguf): every refusal one line and before llama.cpp's converter is
imported, for each class of fault: the output's place (in or over the export, symlinks resolved; a directory; no
folder; an existing file), the converter's lists (read here from a stand-in converter's source), the export read
strictly (truncated weights, a config.json or shard index that disagrees with the tensors), a weight file the
converter would also read (a backup, a stray shard), the experts per layer counted in the weights (a non-uniform
export, a manifest that says something else), the tokenizer (missing, unparseable, no vocabulary, ids shared or past
the model's vocab_size). A stand-in converter module then shows what the staging guarantees (one line naming the
GGUF; a full disk, numpy's short write, a failure or an interrupt leave nothing behind) and how its errors are told
(one line with its step; the traceback only when verbose). llama.cpp's own converter:
tests/integration/deploy/test_gguf.py."""

from __future__ import annotations

import errno
import importlib.util
import json
import logging
import os
import shutil
import sys
import types
import warnings
from pathlib import Path

import pytest

import lightprune as lp
from lightprune.checkpoints import OutputDirError
from lightprune.cli import command, convert_gguf
from lightprune.export import MANIFEST_FILE, gguf
from lightprune.export.gguf import (
    GGUFConversionError,
    GGUFResult,
    convert_to_gguf,
    converter_outtypes,
    converter_pre_tokenizers,
    gpt2_byte_level,
)
from lightprune.testing.tiny import tiny_model

#: a pid above every system's pid_max (Linux allows at most 2**22): no process has it
DEAD_PID = 2**22 + 1

#: the parts of llama.cpp's converter that lightprune reads (its --outtype choices, the names its
#: get_vocab_base_pre gives and those it writes as they are); importing it fails the test
STAND_IN_SCRIPT = '''
import argparse

raise AssertionError("the stand-in converter was imported")


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--outtype", type=str, choices=["f32", "f16", "q8_0", "auto"], default="auto",
        help="output format",
    )
'''
STAND_IN_BASE = '''
class TextModel:
    def get_vocab_base_pre(self, tokenizer) -> str:
        res = None
        if chkhsh == "a":
            res = "gpt-2"
        if chkhsh == 'b':
            res = 'llama-bpe'
        return res

    def set_vocab(self):
        res = "not-a-pre-tokenizer"
        self.gguf_writer.add_tokenizer_pre("default")
'''


class Reached(Exception):
    """llama.cpp's converter would have been imported: every check passed."""


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("llama_cpp")
    (folder / "convert_hf_to_gguf.py").write_text(STAND_IN_SCRIPT)
    (folder / "conversion").mkdir()
    (folder / "conversion" / "base.py").write_text(STAND_IN_BASE)
    (folder / "gguf-py" / "gguf").mkdir(parents=True)
    (folder / "gguf-py" / "gguf" / "__init__.py").write_text("")  # the gguf-py the converter imports
    return folder


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    """A uniform export of the tiny Qwen3-MoE (3 layers of 8 experts, 4 kept each; a 35-token byte-level BPE of its
    128-token vocabulary) and a non-uniform one (5, 4, 3)."""
    from lightprune.data import train_bpe_tokenizer

    tmp = tmp_path_factory.mktemp("gguf_exports")
    tokenizer = train_bpe_tokenizer(["a few words", "and some more"] * 4, 128)
    model = tiny_model("qwen3_moe")
    uniform = lp.select_experts(lp.score_weights(model, "aimer"), ratio=0.5, allocation="uniform")
    lp.export_pruned(model, uniform, tmp / "uniform", processor=tokenizer)
    mixed = lp.ExpertPlan(keep={0: [0, 1, 2, 3, 4], 1: [0, 1, 2, 3], 2: [0, 1, 2]}, num_experts={0: 8, 1: 8, 2: 8})
    lp.export_pruned(tiny_model("qwen3_moe"), mixed, tmp / "non_uniform", processor=tokenizer)
    return {"uniform": tmp / "uniform", "non_uniform": tmp / "non_uniform"}


@pytest.fixture(autouse=True)
def never_converted(monkeypatch):
    """Reaching the converter raises :class:`Reached`: a refusal must come before it."""
    def reached(folder):
        raise Reached(folder)

    monkeypatch.setattr(gguf.converter, "_load_converter", reached)


@pytest.fixture
def export(exports, tmp_path) -> Path:
    """A copy of the uniform export that the test may break."""
    return Path(shutil.copytree(exports["uniform"], tmp_path / "export"))


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def edit_json(file: Path, **changes) -> None:
    file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))


# ------------------------------------------------------------------------------------------- the output's place
@pytest.mark.parametrize("where", ["weights", "config", "new file in it", "the export", "its parent",
                                   "through a symlinked folder", "through a symlink to its weights", "through .."])
def test_an_output_in_the_export_or_over_it_is_refused(export, tmp_path, stand_in, where) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(export)
    (tmp_path / "weights.gguf").symlink_to(export / "model.safetensors")
    out, what = {"weights": (export / "model.safetensors", "is inside"),
                 "config": (export / "config.json", "is inside"),
                 "new file in it": (export / "model.gguf", "is inside"),
                 "the export": (export, "is"),
                 "its parent": (tmp_path, "holds"),
                 "through a symlinked folder": (tmp_path / "link" / "model.gguf", "is inside"),
                 "through a symlink to its weights": (tmp_path / "weights.gguf", "is inside"),
                 "through ..": (tmp_path / "elsewhere" / ".." / "export" / "config.json", "is inside")}[where]
    before = snapshot(export)
    for overwrite in (False, True):
        with pytest.raises(ValueError) as raised:
            convert_to_gguf(export, out, llama_cpp=stand_in, overwrite=overwrite)
        assert str(raised.value) == (f"refusing to write the GGUF to {str(out)!r}: it {what} the export "
                                     f"{str(export.resolve())!r}, whose files it would replace or mix with; choose a "
                                     "path outside the export")
    assert snapshot(export) == before and listing(tmp_path) == ["elsewhere", "export", "link", "weights.gguf"]


def test_an_output_that_is_a_directory_or_has_no_folder_is_refused(export, tmp_path, stand_in) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("x")
    cases = {tmp_path / "folder": (IsADirectoryError, f"output path {str(tmp_path / 'folder')!r} is a directory; "
                                   "name the file to write (a path in it)"),
             f"{tmp_path}/new/": (IsADirectoryError, f"output file {f'{tmp_path}/new/'!r} names a directory; name "
                                  "the file to write"),
             tmp_path / "missing" / "model.gguf": (FileNotFoundError, "the folder of output file "
                                                   f"{str(tmp_path / 'missing' / 'model.gguf')!r} does not exist; "
                                                   "create the folder first, or choose another path"),
             tmp_path / "file" / "model.gguf": (NotADirectoryError, "the folder of output file "
                                                f"{str(tmp_path / 'file' / 'model.gguf')!r} is not a directory; "
                                                "create the folder first, or choose another path")}
    for out, (error, message) in cases.items():
        with pytest.raises(error) as raised:
            convert_to_gguf(export, out, llama_cpp=stand_in)
        assert str(raised.value) == message
    assert listing(tmp_path) == ["export", "file", "folder"] and listing(tmp_path / "folder") == []


def test_an_output_name_with_a_brace_is_refused_as_given(export, tmp_path, stand_in) -> None:
    """The converter fills "{ftype}"-style fields of the name it writes (the staged file's, built from the output's
    name as given): a brace there is refused, a link's target's name is not read (the GGUF replaces the link)."""
    (tmp_path / "b.gguf").write_bytes(b"b")
    (tmp_path / "{a}.gguf").symlink_to(tmp_path / "b.gguf")
    (tmp_path / "a.gguf").symlink_to(tmp_path / "{b}.gguf")
    (tmp_path / "{b}.gguf").write_bytes(b"{b}")
    for name in ("model-{ftype}.gguf", "{a}.gguf", "model}.gguf"):
        with pytest.raises(ValueError) as raised:
            convert_to_gguf(export, tmp_path / name, llama_cpp=stand_in, overwrite=True)
        assert str(raised.value) == (f"output file name {name!r} holds '{{' or '}}', which llama.cpp's converter "
                                     "fills in as a template; name the file as it should be written")
    with pytest.raises(Reached):  # every check passed
        convert_to_gguf(export, tmp_path / "a.gguf", llama_cpp=stand_in, overwrite=True)
    assert listing(tmp_path) == ["a.gguf", "b.gguf", "export", "{a}.gguf", "{b}.gguf"]


def test_an_existing_output_is_replaced_only_with_overwrite(export, tmp_path, stand_in) -> None:
    out = tmp_path / "model.gguf"
    out.write_bytes(b"previous")
    with pytest.raises(FileExistsError) as raised:
        convert_to_gguf(export, out, llama_cpp=stand_in)
    assert str(raised.value) == f"output file {str(out)!r} exists; pass overwrite=True to replace it"
    with pytest.raises(FileExistsError, match=r"exists; pass --overwrite to replace it$"):
        convert_to_gguf(export, out, llama_cpp=stand_in, remedy="pass --overwrite to replace it")
    with pytest.raises(Reached):
        convert_to_gguf(export, out, llama_cpp=stand_in, overwrite=True)
    assert out.read_bytes() == b"previous" and listing(tmp_path) == ["export", "model.gguf"]


def test_a_templated_output_name_is_refused(export, tmp_path, stand_in) -> None:
    with pytest.raises(ValueError, match=r"^output file name 'model-\{ftype\}.gguf' holds '\{' or '\}', which "):
        convert_to_gguf(export, tmp_path / "model-{ftype}.gguf", llama_cpp=stand_in)


def test_a_width_pruned_export_is_refused(export, tmp_path, stand_in) -> None:
    (export / "width_plan.json").write_text("{}")
    with pytest.raises(ValueError, match=r"is width-pruned \(width_plan.json\): it computes with lightprune's "):
        convert_to_gguf(export, tmp_path / "model.gguf", llama_cpp=stand_in)
    (export / "width_plan.json").unlink()
    edit_json(export / MANIFEST_FILE, format="lightprune-width-export")
    with pytest.raises(ValueError, match=r"is width-pruned"):
        convert_to_gguf(export, tmp_path / "model.gguf", llama_cpp=stand_in)


# ------------------------------------------------------------------------------------------- the converter
def test_a_missing_converter_is_one_line_saying_how_to_fetch_it(export, tmp_path, monkeypatch) -> None:
    fetch = ("fetch it with `python scripts/fetch_llama_cpp.py` in a lightprune checkout, or name a llama.cpp tree "
             "with --llama-cpp DIR (llama_cpp=DIR) or $LLAMA_CPP_DIR")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError) as raised:
        convert_to_gguf(export, tmp_path / "model.gguf", llama_cpp=empty)
    assert str(raised.value) == f"no llama.cpp converter (convert_hf_to_gguf.py) in {str(empty)!r} (the folder " \
                                f"named); {fetch}"
    monkeypatch.setenv("LLAMA_CPP_DIR", str(empty))
    with pytest.raises(FileNotFoundError, match=r"\(\$LLAMA_CPP_DIR\); fetch it with"):
        convert_to_gguf(export, tmp_path / "model.gguf")
    monkeypatch.delenv("LLAMA_CPP_DIR")
    monkeypatch.setenv("LIGHTPRUNE_CACHE", str(empty))
    cached = empty / "llama.cpp" / f"llama-cpp-python-{gguf.LLAMA_CPP_VERSION}"
    with pytest.raises(FileNotFoundError) as raised:
        convert_to_gguf(export, tmp_path / "model.gguf")
    assert str(raised.value) == f"no llama.cpp converter (convert_hf_to_gguf.py) in {str(cached)!r} (lightprune's " \
                                f"cache); {fetch}"


def test_a_converter_without_its_gguf_py_is_refused_up_front(export, tmp_path, stand_in, monkeypatch) -> None:
    """A converter folder without its gguf-py imported the gguf installed here, of another version, and failed with
    "AttributeError: DFLASH while reading config.json" (G4_09): refused before anything is read, saying how to fetch
    a whole one. The converter's own NO_LOCAL_GGUF asks for the installed gguf: then none is needed."""
    bare = Path(shutil.copytree(stand_in, tmp_path / "bare"))
    shutil.rmtree(bare / "gguf-py")
    how = ("with `python scripts/fetch_llama_cpp.py` in a lightprune checkout, or name a llama.cpp tree with "
           "--llama-cpp DIR (llama_cpp=DIR) or $LLAMA_CPP_DIR")
    lacks = (f"lacks the gguf-py package it was written with ({str(bare / 'gguf-py' / 'gguf' / '__init__.py')!r} is "
             "not there), so it would import the gguf installed in this Python, of another version; fetch a whole "
             f"converter {how}")
    monkeypatch.delenv("NO_LOCAL_GGUF", raising=False)
    with pytest.raises(FileNotFoundError) as raised:
        convert_to_gguf(export, tmp_path / "model.gguf", llama_cpp=bare)
    assert str(raised.value) == f"llama.cpp's converter in {str(bare)!r} (the folder named) {lacks}"
    monkeypatch.setenv("LLAMA_CPP_DIR", str(bare))
    with pytest.raises(FileNotFoundError) as raised:
        convert_to_gguf(export, tmp_path / "model.gguf")
    assert str(raised.value) == f"llama.cpp's converter in {str(bare)!r} ($LLAMA_CPP_DIR) {lacks}"
    (bare / "gguf-py" / "gguf").mkdir(parents=True)  # a folder without its package's __init__.py: still not there
    with pytest.raises(FileNotFoundError, match=r"lacks the gguf-py package"):
        convert_to_gguf(export, tmp_path / "model.gguf")
    monkeypatch.setenv("NO_LOCAL_GGUF", "1")
    with pytest.raises(Reached):
        convert_to_gguf(export, tmp_path / "model.gguf")
    assert listing(tmp_path) == ["bare", "export"]


def test_the_command_says_a_converter_without_its_gguf_py_in_one_line(export, tmp_path, stand_in, capsys,
                                                                      monkeypatch) -> None:
    bare = Path(shutil.copytree(stand_in, tmp_path / "bare"))
    shutil.rmtree(bare / "gguf-py")
    monkeypatch.delenv("NO_LOCAL_GGUF", raising=False)
    with pytest.raises(SystemExit) as ended:
        convert_gguf.main([str(export), str(tmp_path / "model.gguf"), "--llama-cpp", str(bare)])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"lightprune: error: llama.cpp's converter in {str(bare)!r} (the folder named) lacks the "
                          "gguf-py package it was written with")


@pytest.mark.parametrize("value", ["no", "false", 1, None])
def test_overwrite_must_be_a_bool(export, tmp_path, stand_in, value) -> None:
    """``overwrite="no"`` is a truthy string: it replaced the existing GGUF (G4_23). Refused before anything else."""
    out = tmp_path / "model.gguf"
    out.write_bytes(b"previous")
    with pytest.raises(ValueError) as raised:
        convert_to_gguf(export, out, llama_cpp=stand_in, overwrite=value)
    assert str(raised.value) == f"overwrite must be True or False, got {value!r}"
    assert out.read_bytes() == b"previous" and listing(tmp_path) == ["export", "model.gguf"]


def test_a_fifo_where_the_gguf_goes_is_refused_as_what_it_is(export, tmp_path, stand_in) -> None:
    out = tmp_path / "model.gguf"
    os.mkfifo(out)
    for overwrite in (False, True):
        with pytest.raises(FileExistsError) as raised:
            convert_to_gguf(export, out, llama_cpp=stand_in, overwrite=overwrite)
        assert str(raised.value) == (f"output file {str(out)!r} is not a regular file (a FIFO): move it away, or "
                                     "choose another path")
    assert listing(tmp_path) == ["export", "model.gguf"]


def test_the_choices_are_read_from_the_converters_source(stand_in, tmp_path) -> None:
    assert converter_outtypes(stand_in) == ("f32", "f16", "q8_0", "auto")
    assert converter_pre_tokenizers(stand_in) == ("default", "gpt-2", "llama-bpe")  # not set_vocab's own "res"
    (tmp_path / "convert_hf_to_gguf.py").write_text('parser.add_argument("--outtype", type=str, default="f16")\n')
    with pytest.raises(ValueError, match=r"cannot read the outtypes llama.cpp's converter .* accepts"):
        converter_outtypes(tmp_path)
    with pytest.raises(ValueError, match=r"cannot read the pre-tokenizer names of llama.cpp's converter"):
        converter_pre_tokenizers(tmp_path)


@pytest.mark.parametrize(("outtype", "hint"), [
    ("f64", "did you mean 'f16'?"),
    ("F32", "did you mean 'f32'?"),
    ("int4", "the choices: f32, f16, q8_0, auto"),
])
def test_an_unknown_outtype_is_refused_naming_the_converters_choices(export, tmp_path, stand_in, outtype, hint) -> None:
    with pytest.raises(ValueError) as raised:
        convert_to_gguf(export, tmp_path / "model.gguf", outtype=outtype, llama_cpp=stand_in)
    assert str(raised.value) == (f"outtype {outtype!r} is not one of the --outtype choices of llama.cpp's converter "
                                 f"in {str(stand_in)!r}; {hint}")
    with pytest.raises(ValueError, match=r"^outtype must be a string, got 32$"):
        convert_to_gguf(export, tmp_path / "model.gguf", outtype=32, llama_cpp=stand_in)
    assert listing(tmp_path) == ["export"]


@pytest.mark.parametrize(("name", "hint"), [
    ("gpt2", "did you mean 'gpt-2'?"),
    ("llama", "did you mean 'llama-bpe'?"),
    ("Auto", "did you mean 'auto'?"),
    ("qwen9", "the choices: auto, none, default, gpt-2, llama-bpe"),
])
def test_an_unknown_pre_tokenizer_is_refused_with_a_did_you_mean(export, tmp_path, stand_in, name, hint) -> None:
    with pytest.raises(ValueError) as raised:
        convert_to_gguf(export, tmp_path / "model.gguf", pre_tokenizer=name, llama_cpp=stand_in)
    assert str(raised.value) == (f"pre-tokenizer {name!r} is not one llama.cpp knows (the names its converter in "
                                 f"{str(stand_in)!r} writes as tokenizer.ggml.pre); {hint}")
    for known in ("gpt-2", "default", "none", "auto"):
        with pytest.raises(Reached):
            convert_to_gguf(export, tmp_path / "model.gguf", pre_tokenizer=known, llama_cpp=stand_in)


# ------------------------------------------------------------------------------------------- the export
def _truncate(export: Path) -> None:
    weights = export / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])


def _experts_key(export: Path) -> str:
    config = json.loads((export / "config.json").read_text())
    return next(key for key in ("num_experts", "num_local_experts") if key in config)


FAULTS = {
    "truncated weights": (_truncate, ValueError, "is corrupt or truncated: its tensors end at byte"),
    "a header past the file": (lambda e: (e / "model.safetensors").write_bytes(b"\xff" * 8 + b"{}"), ValueError,
                               "is corrupt or truncated: header length"),
    "config: fewer experts": (lambda e: edit_json(e / "config.json", **{_experts_key(e): 3}), ValueError,
                              "its per-expert tensors do not fit the model's fused parameters"),
    "config: more layers": (lambda e: edit_json(e / "config.json", num_hidden_layers=5), ValueError,
                            "config.json's num_hidden_layers is 5, the weights hold 3 numbered layers"),
    "config: fewer layers": (lambda e: edit_json(e / "config.json", num_hidden_layers=2), ValueError,
                             "the model does not have (model.layers.2."),
    "config: another width": (lambda e: edit_json(e / "config.json", moe_intermediate_size=7), ValueError,
                              "do not fit"),
    "config: not JSON": (lambda e: (e / "config.json").write_text("{"), ValueError, "is not valid JSON"),
    "no config": (lambda e: (e / "config.json").unlink(), FileNotFoundError, "has no config.json"),
    "no weights": (lambda e: (e / "model.safetensors").unlink(), FileNotFoundError, "has no .safetensors weights"),
    "an index naming a missing shard": (
        lambda e: (e / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}})),
        FileNotFoundError, "shard index names missing files ['model-00001-of-00002.safetensors']"),
    "tokenizer.json not JSON": (lambda e: (e / "tokenizer.json").write_text("{"), ValueError,
                                "tokenizer file"),
    "config: vocab_size below the embedding rows": (lambda e: edit_json(e / "config.json", vocab_size=100),
                                                    ValueError, "[128, 32] on disk, [100, 32] in the model"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_broken_export_is_refused_in_one_line_before_the_converter(export, tmp_path, stand_in, fault) -> None:
    damage, error, fragment = FAULTS[fault]
    damage(export)
    with pytest.raises(error) as raised:
        convert_to_gguf(export, tmp_path / "model.gguf", llama_cpp=stand_in)
    message = str(raised.value)
    assert fragment in message and str(export) in message and "\n" not in message, message
    assert listing(tmp_path) == ["export"]


def test_a_non_uniform_export_is_refused_naming_its_counts_read_from_the_weights(exports, tmp_path, stand_in) -> None:
    export = Path(shutil.copytree(exports["non_uniform"], tmp_path / "export"))
    manifest = json.loads((export / MANIFEST_FILE).read_text())
    assert manifest["experts_per_layer"] == {"0": 5, "1": 4, "2": 3} and manifest["uniform"] is False
    message = (f"export {str(export)!r} keeps different numbers of experts per layer ({{0: 5, 1: 4, 2: 3}}); GGUF "
               "stores one expert count for the whole model, so llama.cpp cannot load it. Prune with a uniform "
               "allocation")
    lies = {"as it was": manifest, "claiming uniform": {**manifest, "uniform": True,
                                                        "experts_per_layer": {"0": 4, "1": 4, "2": 4}}}
    for how, record in [*lies.items(), ("without a manifest", None)]:
        if record is None:
            (export / MANIFEST_FILE).unlink()
        else:
            (export / MANIFEST_FILE).write_text(json.dumps(record))
        with pytest.raises(ValueError) as raised:
            convert_to_gguf(export, tmp_path / "model.gguf", llama_cpp=stand_in)
        assert str(raised.value).startswith(message), (how, str(raised.value))
    assert listing(tmp_path) == ["export"]


@pytest.mark.parametrize(("change", "said"), [
    ({"uniform": False, "experts_per_layer": {"0": 5, "1": 4, "2": 3}}, "{0: 5, 1: 4, 2: 3} (uniform: false)"),
    ({"uniform": False}, "{0: 4, 1: 4, 2: 4} (uniform: false)"),
    ({"experts_per_layer": {"0": 4, "1": 4}}, "{0: 4, 1: 4} (uniform: true)"),
    ({"experts_per_layer": {"0": 8, "1": 8, "2": 8}}, "{0: 8, 1: 8, 2: 8} (uniform: true)"),
])
def test_a_manifest_that_disagrees_with_the_weights_is_refused(export, tmp_path, stand_in, change, said) -> None:
    edit_json(export / MANIFEST_FILE, **change)
    with pytest.raises(ValueError) as raised:
        convert_to_gguf(export, tmp_path / "model.gguf", llama_cpp=stand_in)
    assert str(raised.value) == (f"export manifest file {str(export / MANIFEST_FILE)!r} says experts per layer {said}, "
                                 "the weights and config.json hold {0: 4, 1: 4, 2: 4}: the manifest was edited or "
                                 "belongs to another export; restore it, or delete it to convert the weights as they "
                                 "are")


@pytest.mark.parametrize(("text", "fragment"), [
    ("{", "is not valid JSON"),
    ("[1]", "is not a JSON object"),
    ('{"format": "something"}', "has format \"something\", not 'lightprune-export'"),
    ('{"format": "lightprune-export", "uniform": true, "experts_per_layer": {"x": 4}}', "layer key 'x'"),
])
def test_an_unreadable_manifest_is_refused(export, tmp_path, stand_in, text, fragment) -> None:
    (export / MANIFEST_FILE).write_text(text)
    with pytest.raises(ValueError) as raised:
        convert_to_gguf(export, tmp_path / "model.gguf", llama_cpp=stand_in)
    assert fragment in str(raised.value) and "\n" not in str(raised.value)


def test_an_export_without_a_manifest_is_judged_by_its_weights(export, tmp_path, stand_in) -> None:
    (export / MANIFEST_FILE).unlink()
    with pytest.raises(Reached):
        convert_to_gguf(export, tmp_path / "model.gguf", llama_cpp=stand_in)


@pytest.mark.parametrize(("change", "gpt2"), [
    ({}, True),
    ({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "use_regex": True}}, False),
    ({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}}, False),
    ({"pre_tokenizer": {"type": "Metaspace"}}, False),
    ({"normalizer": {"type": "NFC"}}, False),
])
def test_auto_names_gpt2_only_for_gpt2_byte_level_pre_tokenization(tmp_path, change, gpt2) -> None:
    from lightprune.data import train_bpe_tokenizer

    train_bpe_tokenizer(["a few words", "and some more"] * 4, 300).save_pretrained(tmp_path)
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    (tmp_path / "tokenizer.json").write_text(json.dumps({**spec, **change}))
    assert gpt2_byte_level(tmp_path / "tokenizer.json") is gpt2


# ------------------------------------------------------------------------------------------- what the converter reads
def _copy_weights(export: Path, name: str) -> None:
    shutil.copy(export / "model.safetensors", export / name)


@pytest.mark.parametrize("stray", ["model_backup.safetensors", "model-00001-of-00002.safetensors",
                                   "model.old.safetensors", "model_v2.safetensors/"])
def test_a_file_the_converter_would_also_read_is_refused_naming_it(export, tmp_path, stand_in, stray) -> None:
    """llama.cpp's converter reads every model*.safetensors of a folder without a shard index (a directory so named
    too): a backup beside the weights went into the GGUF, a stray shard failed with a KeyError naming no file."""
    if stray.endswith("/"):
        (export / stray).mkdir()
    else:
        _copy_weights(export, stray)
    with pytest.raises((ValueError, OSError)) as raised:
        convert_to_gguf(export, tmp_path / "model.gguf", llama_cpp=stand_in)
    message = str(raised.value)
    assert stray.rstrip("/") in message and str(export) in message and "\n" not in message, message
    assert listing(tmp_path) == ["export"]


def test_the_converters_view_holds_without_the_strict_readers(export, tmp_path, stand_in, monkeypatch) -> None:
    """Refused from the converter's view of the folder alone, before the export is read (a strict reader that
    listed model.safetensors and said nothing more about the folder)."""
    _copy_weights(export, "model_backup.safetensors")
    _copy_weights(export, "model-00001-of-00002.safetensors")
    monkeypatch.setattr(gguf.checks, "weight_files", lambda path: [Path(path) / "model.safetensors"])
    monkeypatch.setattr(gguf.convert, "checked_export", lambda path: pytest.fail("the export was read first"))
    with pytest.raises(ValueError) as raised:
        convert_to_gguf(export, tmp_path / "model.gguf", llama_cpp=stand_in)
    assert str(raised.value) == (f"export {str(export)!r} holds model-00001-of-00002.safetensors, "
                                 "model_backup.safetensors beside its weights (model.safetensors): llama.cpp's "
                                 "converter reads every model*.safetensors of a folder without "
                                 "model.safetensors.index.json and would convert those tensors too (a KeyError, or "
                                 "another file's weights in the GGUF); move them out of the export")


def test_files_the_converter_does_not_read_are_left_alone(export, tmp_path, stand_in) -> None:
    (export / "backup").mkdir()
    _copy_weights(export, "backup/model.safetensors")
    _copy_weights(export, "model.safetensors.bak")
    with pytest.raises(Reached):
        convert_to_gguf(export, tmp_path / "model.gguf", llama_cpp=stand_in)


def test_the_converters_weight_files_follow_its_index_tensors(tmp_path) -> None:
    """Its rule, on names alone: the index's files when there is one, else every model*.safetensors entry; the
    pickles only in a folder without safetensors."""
    for name in ("model.safetensors", "model_backup.safetensors", "model.safetensors.bak", "pytorch_model.bin",
                 "adapter_model.safetensors"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "model-x.safetensors").mkdir()
    assert gguf.converter_weight_files(tmp_path) == ["model-x.safetensors", "model.safetensors",
                                                     "model_backup.safetensors"]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model.safetensors"}}))
    assert gguf.converter_weight_files(tmp_path) == ["model.safetensors"]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["model.safetensors"]}))
    with pytest.raises(ValueError, match=r"has no \"weight_map\" object \{tensor name: file name\}, which llama.cpp"):
        gguf.converter_weight_files(tmp_path)
    for name in ("model.safetensors.index.json", "model.safetensors", "model_backup.safetensors",
                 "adapter_model.safetensors"):
        (tmp_path / name).unlink()
    (tmp_path / "model-x.safetensors").rmdir()
    (tmp_path / "pytorch_model-00002.bin").write_bytes(b"")
    assert gguf.converter_weight_files(tmp_path) == ["pytorch_model-00002.bin", "pytorch_model.bin"]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    """The uniform export's model written in two shards (``save_pruned(max_shard_size=...)``)."""
    from lightprune.data import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(["a few words", "and some more"] * 4, 128)
    model = tiny_model("qwen3_moe")
    lp.prune_experts(model, lp.select_experts(lp.score_weights(model, "aimer"), ratio=0.5, allocation="uniform"))
    out = tmp_path_factory.mktemp("gguf_sharded") / "sharded"
    lp.save_pruned(model, out, processor=tokenizer, max_shard_size="100KB")
    return out


def test_a_shard_index_naming_its_shards_with_dot_slash_is_read_as_the_checkpoint_reads_it(sharded, tmp_path,
                                                                                            stand_in) -> None:
    """transformers joins an index's "./model-00001-of-00002.safetensors" to the folder, and so do the strict reader
    and llama.cpp's converter: the converter's files are the shards, no stray file beside the weights."""
    export = Path(shutil.copytree(sharded, tmp_path / "export"))
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = json.loads((export / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    index["weight_map"] = {key: f"./{value}" for key, value in index["weight_map"].items()}
    (export / "model.safetensors.index.json").write_text(json.dumps(index))
    assert gguf.converter_weight_files(export) == shards
    with pytest.raises(Reached):  # every check passed
        convert_to_gguf(export, tmp_path / "model.gguf", llama_cpp=stand_in)
    assert listing(tmp_path) == ["export"]


def _tokenizer_json(change):
    def damage(export: Path) -> None:
        spec = json.loads((export / "tokenizer.json").read_text())
        change(spec)
        (export / "tokenizer.json").write_text(json.dumps(spec))
    return damage


def _tokenizer_config(**changes):
    return lambda export: edit_json(export / "tokenizer_config.json", **changes)


def _no_tokenizer(export: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (export / name).unlink()


def _sentencepiece(pieces: int):
    """A tokenizer.model of ``pieces`` pieces (protobuf: field 1, ``{piece: "a", score: 0}`` each) and no
    tokenizer.json."""
    def damage(export: Path) -> None:
        (export / "tokenizer.json").unlink()
        (export / "tokenizer.model").write_bytes(b"\x0a\x08\x0a\x01a\x15\x00\x00\x00\x00" * pieces)
    return damage


def _set_vocab(spec: dict, token: str, index: int) -> None:
    spec["model"]["vocab"][token] = index


def _added(spec: dict, token: str, index: int) -> None:
    spec["added_tokens"].append({"id": index, "content": token, "special": True, "normalized": False})


#: {fault: (damage, the file named, what the message says)}; the tiny model has 128 embedding rows
TOKENIZER_FAULTS = {
    "no tokenizer files": (_no_tokenizer, "", "has no tokenizer (no tokenizer.json, tokenizer.model, vocab.json)"),
    "tokenizer.json without a vocabulary": (
        lambda e: (e / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}})),
        "tokenizer.json", "has no vocabulary (its model.vocab is missing or empty)"),
    "tokenizer.json a list": (lambda e: (e / "tokenizer.json").write_text("[]"), "tokenizer.json",
                              "is not a JSON object"),
    "no added_tokens": (_tokenizer_json(lambda t: t.pop("added_tokens")), "tokenizer.json",
                        "has no added_tokens list"),
    "a token past vocab_size": (_tokenizer_json(lambda t: _set_vocab(t, "zz", 200)), "tokenizer.json",
                                'model.vocab has 1 token(s) at ids 128 and above (the last: "zz" at 200), past '
                                "config.json's vocab_size 128"),
    "an added token past vocab_size": (_tokenizer_json(lambda t: _added(t, "<|x|>", 128)), "tokenizer.json",
                                       'added_tokens has 1 token(s) at ids 128 and above (the last: "<|x|>" at 128)'),
    "two tokens of one id": (_tokenizer_json(lambda t: _set_vocab(t, "zz", 20)), "tokenizer.json",
                             'model.vocab gives the id 20 to two tokens'),
    "an added token on another's id": (_tokenizer_json(lambda t: _added(t, "<|x|>", 20)), "tokenizer.json",
                                       "model.vocab with added_tokens gives the id 20 to two tokens"),
    "a negative id": (_tokenizer_json(lambda t: _set_vocab(t, "zz", -1)), "tokenizer.json",
                      'model.vocab gives "zz" the id -1, not a token (a string) with an id (an integer from 0)'),
    "a BPE without merges": (_tokenizer_json(lambda t: t["model"].update(merges=[])), "tokenizer.json",
                             "is a BPE without merges"),
    "a model transformers does not read": (_tokenizer_json(lambda t: t["model"].update(type="Nope")), "",
                                           "does not load with transformers' AutoTokenizer"),
    "tokenizer_config.json not JSON": (lambda e: (e / "tokenizer_config.json").write_text("{"),
                                       "tokenizer_config.json", "is not valid JSON"),
    "tokenizer_config.json: a token past vocab_size": (
        _tokenizer_config(added_tokens_decoder={"300": {"content": "<|y|>", "special": True}}),
        "tokenizer_config.json", 'added_tokens_decoder has 1 token(s) at ids 128 and above (the last: "<|y|>" at '
                                 "300)"),
    "added_tokens.json: a token past vocab_size": (
        lambda e: (e / "added_tokens.json").write_text(json.dumps({"<|z|>": 128})), "added_tokens.json",
        "the added tokens has 1 token(s) at ids 128 and above"),
    "config.json: an eos id past vocab_size": (lambda e: edit_json(e / "config.json", eos_token_id=[1, 999]),
                                               "config.json", "has eos_token_id 999, past its vocab_size 128"),
    "a sentencepiece model past vocab_size": (_sentencepiece(200), "tokenizer.model",
                                              "holds 200 pieces, more than config.json's vocab_size 128"),
    "a tokenizer.model that is not one": (lambda e: (e / "tokenizer.model").write_bytes(b"\xff\xff"),
                                          "tokenizer.model", "is not a sentencepiece model"),
}


@pytest.mark.parametrize("fault", list(TOKENIZER_FAULTS))
def test_a_tokenizer_the_converter_would_fail_on_or_convert_wrongly_is_refused(export, tmp_path, stand_in,
                                                                               fault) -> None:
    damage, file, fragment = TOKENIZER_FAULTS[fault]
    damage(export)
    with pytest.raises(ValueError) as raised:
        convert_to_gguf(export, tmp_path / "model.gguf", llama_cpp=stand_in)
    message = str(raised.value)
    assert fragment in message and str(export / file) in message and "\n" not in message, message
    assert listing(tmp_path) == ["export"]


def test_a_sentencepiece_tokenizer_needs_its_package(export, tmp_path, stand_in, monkeypatch) -> None:
    _sentencepiece(100)(export)
    find_spec = gguf.tokenizer.importlib.util.find_spec
    monkeypatch.setattr(gguf.tokenizer.importlib.util, "find_spec", lambda name, *a: None if name == "sentencepiece" else
                        find_spec(name, *a))
    with pytest.raises(ValueError) as raised:
        convert_to_gguf(export, tmp_path / "model.gguf", llama_cpp=stand_in)
    assert str(raised.value) == (f"the tokenizer of export {str(export)!r} is a sentencepiece model (tokenizer.model), "
                                 "which llama.cpp's converter reads with the sentencepiece package, not installed "
                                 "here; install it (pip install -e '.[deploy]', which brings it), or save the "
                                 "tokenizer's tokenizer.json into the export")
    monkeypatch.setattr(gguf.tokenizer.importlib.util, "find_spec", lambda name, *a: object())
    with pytest.raises(Reached):  # 100 pieces of a 128-row model, its package there
        convert_to_gguf(export, tmp_path / "model.gguf", llama_cpp=stand_in)


def test_a_tokenizer_smaller_than_the_model_is_converted(export, tmp_path, stand_in) -> None:
    """Fewer tokens than embedding rows (the converter pads them), specials on the vocabulary's own ids."""
    _tokenizer_json(lambda t: _set_vocab(t, "zz", 127))(export)
    with pytest.raises(Reached):
        convert_to_gguf(export, tmp_path / "model.gguf", llama_cpp=stand_in)


# ------------------------------------------------------------------------------------------- a stand-in run
class _TextModel:
    """The stand-in's class that names the pre-tokenizer (the export's byte-level BPE gets ``gpt-2``)."""

    def get_vocab_base_pre(self, tokenizer) -> str:
        raise NotImplementedError("BPE pre-tokenizer was not recognized")


def _stand_in_module(run) -> types.ModuleType:
    """A converter module whose ``main`` calls ``run(export, outfile, outtype)`` with its command line's values."""
    module = types.ModuleType("stand_in_converter")

    def main() -> None:
        argv = sys.argv
        run(Path(argv[1]), Path(argv[argv.index("--outfile") + 1]), argv[argv.index("--outtype") + 1])

    module.main = main
    module.TextModel = _TextModel
    return module


def _gguf_bytes(tensors: int, size: int = 64) -> bytes:
    return b"GGUF" + (3).to_bytes(4, "little") + tensors.to_bytes(8, "little") + bytes(size - 16)


def test_a_conversion_writes_beside_the_output_and_names_the_real_file(export, tmp_path, stand_in,
                                                                       monkeypatch) -> None:
    seen = {}

    def run(source: Path, outfile: Path, outtype: str) -> None:
        seen.update(source=source, outfile=outfile, outtype=outtype, there=sorted(p.name for p in tmp_path.iterdir()))
        outfile.write_bytes(_gguf_bytes(tensors=27, size=100))

    monkeypatch.setattr(gguf.converter, "_load_converter", lambda folder: _stand_in_module(run))
    stale = tmp_path / f".model.gguf.lightprune-tmp-{DEAD_PID}-0123456789ab"
    live = tmp_path / f".model.gguf.lightprune-tmp-{os.getpid()}-0123456789ab"
    stale.write_bytes(b"left by a killed run")
    live.write_bytes(b"a run of this process")
    result = convert_to_gguf(export, tmp_path / "model.gguf", outtype="f16", llama_cpp=stand_in)
    out = tmp_path / "model.gguf"
    assert isinstance(result, GGUFResult) and os.fspath(result) == str(out)
    assert (result.path, result.size, result.tensors, result.outtype, result.pre_tokenizer) == (out, 100, 27, "f16",
                                                                                                None)
    assert result.summary() == f"wrote {out} (100 bytes, 27 tensors, outtype f16) in {result.seconds:.1f} s"
    assert seen["source"] == export and seen["outtype"] == "f16"
    assert seen["outfile"].parent == tmp_path and seen["outfile"].name.startswith(".model.gguf.lightprune-tmp-")
    assert seen["outfile"].name in seen["there"] and stale.name not in seen["there"]  # staged, the stale one gone
    assert listing(tmp_path) == sorted([live.name, "export", "model.gguf"])


def test_an_output_named_with_the_longest_name_the_folder_allows_is_converted(export, tmp_path, stand_in,
                                                                             monkeypatch) -> None:
    """A valid 255-byte name was refused with a raw "[Errno 36] File name too long" about lightprune's own hidden
    temporary file (G4_05): the staged name's part from the output's name is shortened, and the GGUF written."""
    seen = {}

    def run(source: Path, outfile: Path, outtype: str) -> None:
        seen["outfile"] = outfile
        outfile.write_bytes(_gguf_bytes(tensors=27, size=100))

    monkeypatch.setattr(gguf.converter, "_load_converter", lambda folder: _stand_in_module(run))
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    out = tmp_path / ("g" * (limit - 5) + ".gguf")
    result = convert_to_gguf(export, out, llama_cpp=stand_in)
    assert (result.path, result.size, result.tensors) == (out, 100, 27) and listing(tmp_path) == ["export", out.name]
    assert len(os.fsencode(seen["outfile"].name)) <= limit and seen["outfile"].parent == tmp_path
    too_long = tmp_path / ("g" * (limit - 4) + ".gguf")
    with pytest.raises(OSError) as raised:
        convert_to_gguf(export, too_long, llama_cpp=stand_in)
    assert str(raised.value) == (f"[Errno {errno.ENAMETOOLONG}] output file name {too_long.name!r} is {limit + 1} "
                                 f"bytes long, more than the {limit} the file system of {str(tmp_path)!r} allows in "
                                 "a name; choose a shorter name")


@pytest.mark.parametrize("previous", [b"the previous GGUF", None], ids=["replacing", "creating"])
def test_a_full_disk_leaves_nothing_behind_and_the_output_as_it_was(export, tmp_path, stand_in, monkeypatch,
                                                                     previous) -> None:
    out = tmp_path / "model.gguf"
    if previous is not None:
        out.write_bytes(previous)

    def run(source: Path, outfile: Path, outtype: str) -> None:
        with open(outfile, "wb") as handle:
            handle.write(_gguf_bytes(tensors=27, size=40))
            raise OSError(errno.ENOSPC, "No space left on device", str(outfile))

    monkeypatch.setattr(gguf.converter, "_load_converter", lambda folder: _stand_in_module(run))
    with pytest.raises(OutputDirError) as raised:
        convert_to_gguf(export, out, llama_cpp=stand_in, overwrite=True)
    kept = "is as it was" if previous is not None else "was not created"
    assert str(raised.value) == f"no space left on the device holding {str(out)!r}; nothing was written, " \
                                f"{str(out)!r} {kept}"
    assert raised.value.errno == errno.ENOSPC
    assert listing(tmp_path) == (["export", "model.gguf"] if previous is not None else ["export"])
    assert previous is None or out.read_bytes() == previous


_TOO_LARGE = ("file too large for the device holding {out!r} (the file size limit: `ulimit -f`, or the file "
              "system's largest file); nothing was written, {out!r} is as it was")


@pytest.mark.parametrize(("code", "said"), [
    (errno.EFBIG, _TOO_LARGE),
    (errno.EACCES, "cannot write to {folder!r}: permission denied; nothing was written, {out!r} is as it was"),
    (errno.EROFS, "cannot write to {folder!r}: read-only file system; nothing was written, {out!r} is as it was"),
    (errno.EPERM, "cannot write to {folder!r}: operation not permitted; nothing was written, {out!r} is as it was"),
], ids=["EFBIG", "EACCES", "EROFS", "EPERM"])
def test_a_staged_write_refused_for_size_or_permission_is_stagings_one_line(export, tmp_path, stand_in, monkeypatch,
                                                                           code, said) -> None:
    out = tmp_path / "model.gguf"
    out.write_bytes(b"previous")

    def run(source: Path, outfile: Path, outtype: str) -> None:
        outfile.write_bytes(b"GGUF partial")
        raise OSError(code, os.strerror(code), str(outfile))

    monkeypatch.setattr(gguf.converter, "_load_converter", lambda folder: _stand_in_module(run))
    with pytest.raises(OutputDirError) as raised:
        convert_to_gguf(export, out, llama_cpp=stand_in, overwrite=True)
    assert str(raised.value) == said.format(out=str(out), folder=str(tmp_path))
    assert raised.value.errno == code and isinstance(raised.value.__cause__, OSError)
    assert out.read_bytes() == b"previous" and listing(tmp_path) == ["export", "model.gguf"]


def test_another_staged_write_error_is_a_conversion_error(export, tmp_path, stand_in, monkeypatch) -> None:
    out, staged = tmp_path / "model.gguf", []

    def run(source: Path, outfile: Path, outtype: str) -> None:
        staged.append(outfile)
        raise OSError(errno.EIO, "Input/output error", str(outfile))

    monkeypatch.setattr(gguf.converter, "_load_converter", lambda folder: _stand_in_module(run))
    with pytest.raises(GGUFConversionError) as raised:
        convert_to_gguf(export, out, llama_cpp=stand_in)
    assert str(raised.value) == (f"llama.cpp's converter could not write the GGUF {str(out)!r}: OSError: [Errno 5] "
                                 f"Input/output error: {str(staged[0])!r}; nothing was written, {str(out)!r} was not "
                                 "created")
    assert listing(tmp_path) == ["export"]


def _refuses(source: Path, outfile: Path, outtype: str) -> None:
    logging.getLogger("hf-to-gguf").error("Model Qwen3MoeForCausalLM is not supported")
    sys.exit(1)


def _unrecognised(source: Path, outfile: Path, outtype: str) -> None:
    outfile.write_bytes(b"GGUF partial")
    raise NotImplementedError("BPE pre-tokenizer was not recognized - update get_vocab_base_pre()")


def _writes_nothing(source: Path, outfile: Path, outtype: str) -> None:
    pass


def _interrupted(source: Path, outfile: Path, outtype: str) -> None:
    outfile.write_bytes(b"GGUF partial")
    raise KeyboardInterrupt


# the converter's steps, named as its functions are (the outermost of them in the traceback names the step)
def set_vocab(error: BaseException) -> None:
    raise error


def index_tensors(error: BaseException) -> None:
    raise error


def _set_vocab_sentencepiece(error: BaseException) -> None:
    raise error


def _key_error(source: Path, outfile: Path, outtype: str) -> None:
    set_vocab(KeyError("added_tokens"))  # transformers on a tokenizer.json without added_tokens


def _reads_a_directory(source: Path, outfile: Path, outtype: str) -> None:
    index_tensors(IsADirectoryError(errno.EISDIR, "Is a directory", str(source / "model_x.safetensors")))


def _no_module(source: Path, outfile: Path, outtype: str) -> None:
    _set_vocab_sentencepiece(ModuleNotFoundError("No module named 'sentencepiece'", name="sentencepiece"))


def _short_write(source: Path, outfile: Path, outtype: str) -> None:
    outfile.write_bytes(b"GGUF partial")
    raise OSError("2048 requested and 640 written")  # numpy's tofile on a full disk: no errno


@pytest.mark.parametrize(("run", "error", "message"), [
    (_refuses, GGUFConversionError, "llama.cpp's converter refused {export!r}: Model Qwen3MoeForCausalLM is not "
                                    "supported"),
    (_unrecognised, GGUFConversionError, "llama.cpp's converter failed on {export!r}: NotImplementedError: BPE "
                                         "pre-tokenizer was not recognized - update get_vocab_base_pre(); name the "
                                         "tokenizer's pre-tokenizer with --pre-tokenizer NAME (pre_tokenizer=NAME)"),
    (_writes_nothing, GGUFConversionError, "llama.cpp's converter wrote no GGUF for {export!r} (0 bytes starting "
                                           "b'')"),
    (_interrupted, KeyboardInterrupt, ""),
    (_key_error, GGUFConversionError, "llama.cpp's converter failed on {export!r} while reading the tokenizer "
                                      "(set_vocab): KeyError: 'added_tokens'"),
    (_reads_a_directory, GGUFConversionError, "llama.cpp's converter failed on {export!r} while reading the weights "
                                              "(index_tensors): IsADirectoryError: [Errno 21] Is a directory: "
                                              "'{export}/model_x.safetensors'"),
    (_no_module, GGUFConversionError, "llama.cpp's converter failed on {export!r} while reading the tokenizer "
                                      "(_set_vocab_sentencepiece): ModuleNotFoundError: No module named "
                                      "'sentencepiece'; install it (pip install -e '.[deploy]', which brings "
                                      "it)"),
    (_short_write, GGUFConversionError, "llama.cpp's converter could not write the GGUF {out!r}: OSError: 2048 "
                                        "requested and 640 written; nothing was written, {out!r} is as it was"),
], ids=["refused", "failed", "wrote nothing", "interrupted", "a KeyError in a step", "an OSError reading",
        "a missing module", "a short write, the disk not full"])
def test_a_failed_conversion_leaves_nothing_behind(export, tmp_path, stand_in, monkeypatch, capfd, run, error,
                                                   message) -> None:
    out = tmp_path / "model.gguf"
    out.write_bytes(b"previous")
    monkeypatch.setattr(gguf.converter, "_load_converter", lambda folder: _stand_in_module(run))
    with pytest.raises(error) as raised:
        convert_to_gguf(export, out, llama_cpp=stand_in, overwrite=True)
    assert str(raised.value) == message.format(export=str(export), out=str(out))
    assert out.read_bytes() == b"previous" and listing(tmp_path) == ["export", "model.gguf"]
    assert capfd.readouterr() == ("", "")  # the converter's error record is in the message, not printed


def test_an_error_without_a_message_names_the_line_that_raised_it(export, tmp_path, stand_in, monkeypatch) -> None:
    """The converter's bare ``assert`` (its get_vocab_base on a tokenizer larger than the model) said
    "AssertionError: AssertionError"."""
    (tmp_path / "steps").mkdir()
    (tmp_path / "steps" / "base.py").write_text("def get_vocab_base(tokens, vocab_size):\n"
                                                "    assert tokens < vocab_size\n")
    spec = importlib.util.spec_from_file_location("stand_in_base", tmp_path / "steps" / "base.py")
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)  # not a test module: its assert is Python's own, without a message
    monkeypatch.setattr(gguf.converter, "_load_converter",
                        lambda folder: _stand_in_module(lambda *args: base.get_vocab_base(320, 128)))
    with pytest.raises(GGUFConversionError) as raised:
        convert_to_gguf(export, tmp_path / "model.gguf", llama_cpp=stand_in)
    assert str(raised.value) == (f"llama.cpp's converter failed on {str(export)!r}: AssertionError: assert tokens < "
                                 "vocab_size (base.py:2)")
    assert isinstance(raised.value.__cause__, AssertionError) and listing(tmp_path) == ["export", "steps"]


@pytest.mark.parametrize("previous", [b"the previous GGUF", None], ids=["replacing", "creating"])
def test_numpys_short_write_on_a_full_disk_is_the_full_disk_line(export, tmp_path, stand_in, monkeypatch,
                                                                 previous) -> None:
    """numpy's ``tofile`` says "2048 requested and 640 written", no errno: one more write finds it (ENOSPC)."""
    out = tmp_path / "model.gguf"
    if previous is not None:
        out.write_bytes(previous)
    probes = []

    def full_disk(file, mode="r", *args, **kwargs):
        if mode == "ab":
            probes.append(Path(file).name)
            raise OSError(errno.ENOSPC, "No space left on device", str(file))
        return open(file, mode, *args, **kwargs)

    monkeypatch.setattr(gguf.run, "open", full_disk, raising=False)
    monkeypatch.setattr(gguf.converter, "_load_converter", lambda folder: _stand_in_module(_short_write))
    with pytest.raises(OutputDirError) as raised:
        convert_to_gguf(export, out, llama_cpp=stand_in, overwrite=True)
    kept = "is as it was" if previous is not None else "was not created"
    assert str(raised.value) == f"no space left on the device holding {str(out)!r}; nothing was written, " \
                                f"{str(out)!r} {kept}"
    assert raised.value.errno == errno.ENOSPC and len(probes) == 1 and probes[0].startswith(".model.gguf.lightprune")
    assert listing(tmp_path) == (["export", "model.gguf"] if previous is not None else ["export"])
    assert previous is None or out.read_bytes() == previous


def _chatty(source: Path, outfile: Path, outtype: str) -> None:
    logging.basicConfig(level=logging.INFO)  # what the converter's main does
    logging.getLogger("hf-to-gguf").info("Loading model: export")
    logging.getLogger("gguf.gguf_writer").info("gguf: This GGUF file is for Little Endian only")
    logging.getLogger("hf-to-gguf").warning("Unknown RoPE type: default")
    warnings.warn("a converter warning", UserWarning, stacklevel=1)
    outfile.write_bytes(_gguf_bytes(tensors=3))


@pytest.mark.parametrize("loud", [False, True], ids=["quiet", "verbose"])
def test_the_converters_logging_and_warnings_are_dropped_unless_verbose(export, tmp_path, stand_in, monkeypatch,
                                                                        capfd, caplog, loud) -> None:
    monkeypatch.setenv("LIGHTPRUNE_VERBOSE", "1" if loud else "0")
    monkeypatch.setattr(gguf.converter, "_load_converter", lambda folder: _stand_in_module(_chatty))
    caplog.set_level(logging.INFO)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        convert_to_gguf(export, tmp_path / "model.gguf", llama_cpp=stand_in)
    shown = [record.getMessage() for record in caplog.records if record.name.startswith(("hf-to-gguf", "gguf"))]
    assert shown == (["Loading model: export", "gguf: This GGUF file is for Little Endian only",
                      "Unknown RoPE type: default"] if loud else [])
    assert [str(w.message) for w in caught] == (["a converter warning"] if loud else [])
    assert capfd.readouterr() == ("", "")
    assert (list(root.handlers), root.level) == (handlers, level)  # as the converter's basicConfig found them


# ------------------------------------------------------------------------------------------- the command
def test_the_command_is_dispatched_before_lightning(export, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "lightprune.cli.app", None)  # importing Lightning's CLI fails the test
    monkeypatch.setattr(sys, "argv", ["lightprune", "--verbose", "convert-gguf", str(export)])
    with pytest.raises(SystemExit) as raised:
        command.main()
    assert raised.value.code == 2
    assert capsys.readouterr().err == ("lightprune: error: the following arguments are required: outfile "
                                       "(`lightprune convert-gguf --help` lists the options)\n")
    assert "  convert-gguf  " in command.HELP and "lightprune [--verbose] convert-gguf EXPORT OUTFILE" in command.HELP


@pytest.fixture
def command_env(monkeypatch):
    """The environment the command sets (its quiet defaults), restored after the test."""
    for name in ("LIGHTPRUNE_VERBOSE", "HF_HUB_DISABLE_PROGRESS_BARS", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(name, os.environ.get(name, "0"))


def test_a_refusal_of_the_command_is_one_line_and_status_2(export, tmp_path, stand_in, command_env,
                                                           capsys) -> None:
    with pytest.raises(SystemExit) as raised:
        convert_gguf.main([str(export), str(export / "model.safetensors"), "--llama-cpp", str(stand_in)])
    assert raised.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (f"lightprune: error: refusing to write the GGUF to "
                                 f"{str(export / 'model.safetensors')!r}: it is inside the export "
                                 f"{str(export.resolve())!r}, whose files it would replace or mix with; choose a path "
                                 "outside the export\n")
    (tmp_path / "model.gguf").write_bytes(b"previous")
    with pytest.raises(SystemExit):
        convert_gguf.main([str(export), str(tmp_path / "model.gguf"), "--llama-cpp", str(stand_in)])
    assert capsys.readouterr().err == (f"lightprune: error: output file {str(tmp_path / 'model.gguf')!r} exists; "
                                       "pass --overwrite to replace it\n")


@pytest.mark.parametrize("loud", [False, True], ids=["quiet", "verbose"])
def test_a_converter_failure_is_one_line_with_its_traceback_only_when_verbose(export, tmp_path, stand_in, command_env,
                                                                            monkeypatch, capsys, loud) -> None:
    monkeypatch.setattr(gguf.converter, "_load_converter", lambda folder: _stand_in_module(_key_error))
    with pytest.raises(SystemExit) as raised:
        convert_gguf.main([str(export), str(tmp_path / "model.gguf"), "--llama-cpp", str(stand_in),
                           *(["--verbose"] if loud else [])])
    assert raised.value.code == 2
    out, err = capsys.readouterr()
    line = (f"lightprune: error: llama.cpp's converter failed on {str(export)!r} while reading the tokenizer "
            "(set_vocab): KeyError: 'added_tokens'\n")
    assert out == "" and err.endswith(line)
    if loud:
        assert err.startswith("Traceback (most recent call last):\n") and "in set_vocab\n" in err
        assert err.endswith("\nKeyError: 'added_tokens'\n" + line)  # the converter's error, then the line
    else:
        assert err == line


def test_a_conversion_by_the_command_prints_one_line(export, tmp_path, stand_in, command_env, monkeypatch,
                                                     capsys) -> None:
    monkeypatch.setattr(gguf.converter, "_load_converter", lambda folder: _stand_in_module(_chatty))
    out = tmp_path / "model.gguf"
    out.write_bytes(b"previous")
    convert_gguf.main([str(export), str(out), "--llama-cpp", str(stand_in), "--outtype", "q8_0", "--overwrite"])
    printed = capsys.readouterr()
    assert printed.err == "" and printed.out.startswith(f"wrote {out} (64 bytes, 3 tensors, outtype q8_0) in ")
    assert printed.out.count("\n") == 1 and listing(tmp_path) == ["export", "model.gguf"]

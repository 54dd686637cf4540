"""Convert a uniform lightprune export to GGUF with llama.cpp's own converter, naming the pre-tokenizer it needs.

    python scripts/fetch_llama_cpp.py                              # once: the converter, into the cache
    python scripts/convert_to_gguf.py outputs/quickstart/model model.gguf --outtype f32

This runs llama.cpp's ``convert_hf_to_gguf.py`` (from ``--llama-cpp``, ``$LLAMA_CPP_DIR`` or the folder
``scripts/fetch_llama_cpp.py`` fills) on the export, in this process, with one change: GGUF names a tokenizer's
pre-tokenizer (``tokenizer.ggml.pre``), and the converter recognises a tokenizer by a fingerprint of how it
encodes a fixed text, which only published tokenizers have. A tokenizer lightprune trained (the testbeds', a
``train_bpe_tokenizer``) is unknown to it, and the converter stops ("BPE pre-tokenizer was not recognized").
``--pre-tokenizer auto`` (default) then names ``gpt-2`` when, and only when, the export's ``tokenizer.json``
declares GPT-2's byte-level pre-tokenization (a ``ByteLevel`` pre-tokenizer with its regex and no prefix space,
no normaliser), which is what llama.cpp's ``gpt-2`` pre-tokenizer does; ``--pre-tokenizer NAME`` names another;
``none`` leaves the converter's refusal. A tokenizer the converter knows is never overridden. The GGUF is
written beside ``outfile`` and renamed over it once complete: a failed conversion leaves nothing behind.

llama.cpp stores one expert count per model (``<arch>.expert_count``): an export whose layers keep different
numbers of experts (``uniform: false`` in ``lightprune_export.json``) is refused here, naming the counts; prune
with a uniform allocation for llama.cpp (docs/guides/deployment.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fetch_llama_cpp import converter_dir

__all__ = ["gpt2_byte_level", "main"]


def gpt2_byte_level(tokenizer_json: Path) -> bool:
    """True when ``tokenizer.json`` declares GPT-2's pre-tokenization: a byte-level BPE, a ``ByteLevel``
    pre-tokenizer with its regex and without a prefix space, and no normaliser."""
    spec = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    pre = spec.get("pre_tokenizer") or {}
    return (spec.get("normalizer") is None and (spec.get("model") or {}).get("type") == "BPE"
            and pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space"))


def check_uniform(export: Path) -> None:
    """Refuse a lightprune export whose layers keep different numbers of experts (its manifest says so)."""
    manifest = export / "lightprune_export.json"
    if not manifest.is_file():
        return  # not a lightprune export: the converter judges it
    record = json.loads(manifest.read_text(encoding="utf-8"))
    if record.get("uniform") is False:
        counts = record.get("experts_per_layer")
        raise SystemExit(f"convert_to_gguf: {export} keeps different numbers of experts per layer ({counts}); "
                         "GGUF stores one expert count for the whole model, so llama.cpp cannot load it. Prune with "
                         "a uniform allocation (ExpertPruning(..., allocation='uniform'), lp.select_experts(..., "
                         "allocation='uniform')) for llama.cpp, or serve this export with transformers.")


def _text_model(converter):
    """The converter's class that names the pre-tokenizer (in ``conversion.base`` in newer llama.cpp trees, in
    the converter's own module in older ones)."""
    try:
        from conversion.base import TextModel
    except ImportError:
        TextModel = getattr(converter, "TextModel", None)
    if TextModel is None or not hasattr(TextModel, "get_vocab_base_pre"):
        raise SystemExit("convert_to_gguf: this converter has no TextModel.get_vocab_base_pre to name the "
                         "pre-tokenizer with; use --pre-tokenizer none or another llama.cpp version")
    return TextModel


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path, help="the export's folder (config.json, model.safetensors, tokenizer)")
    parser.add_argument("outfile", type=Path, help="the GGUF file to write")
    parser.add_argument("--outtype", default="f32", help="the converter's --outtype (f32, f16, bf16, q8_0, ...)")
    parser.add_argument("--pre-tokenizer", default="auto",
                        help="auto (gpt-2 for GPT-2 byte-level tokenizers), none, or a llama.cpp pre-tokenizer name")
    parser.add_argument("--llama-cpp", type=Path, default=None,
                        help="folder holding convert_hf_to_gguf.py (default: $LLAMA_CPP_DIR, else the fetched one)")
    args = parser.parse_args(argv)
    export = args.export.resolve()
    if not (export / "config.json").is_file():
        raise SystemExit(f"convert_to_gguf: {export} has no config.json: not a checkpoint folder")
    check_uniform(export)
    folder = (args.llama_cpp or converter_dir()).expanduser().resolve()
    if not (folder / "convert_hf_to_gguf.py").is_file():
        raise SystemExit(f"convert_to_gguf: no convert_hf_to_gguf.py in {folder}; run "
                         "`python scripts/fetch_llama_cpp.py` or pass --llama-cpp")
    name = args.pre_tokenizer
    if name == "auto":
        tokenizer_json = export / "tokenizer.json"
        name = "gpt-2" if tokenizer_json.is_file() and gpt2_byte_level(tokenizer_json) else "none"

    sys.path.insert(0, str(folder))
    import convert_hf_to_gguf as converter

    if name != "none":
        TextModel = _text_model(converter)
        recognise = TextModel.get_vocab_base_pre

        def get_vocab_base_pre(self, tokenizer):
            log = logging.getLogger("hf-to-gguf")
            level = log.level
            log.setLevel(logging.ERROR)  # its banner about an unknown fingerprint: the line below says it
            try:
                return recognise(self, tokenizer)
            except NotImplementedError:  # the converter's "not recognized": name it as asked
                print(f"convert_to_gguf: llama.cpp does not know this tokenizer's fingerprint; "
                      f"tokenizer.ggml.pre = {name!r}", file=sys.stderr)
                return name
            finally:
                log.setLevel(level)

        TextModel.get_vocab_base_pre = get_vocab_base_pre
    outfile = args.outfile.resolve()
    staged = outfile.with_name(f".{outfile.name}.tmp-{os.getpid()}")  # renamed over outfile once complete
    sys.argv = ["convert_hf_to_gguf.py", str(export), "--outfile", str(staged), "--outtype", args.outtype]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        converter.main()
        os.replace(staged, outfile)
    finally:
        staged.unlink(missing_ok=True)


if __name__ == "__main__":
    main()

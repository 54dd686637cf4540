"""GGUF for llama.cpp: an export converted by llama.cpp's own converter, as strictly as lightprune reads and writes
checkpoints: [`convert_to_gguf`][] (the ``lightprune convert-gguf`` command). The modules: `converter`
(finding and importing llama.cpp's converter, what it accepts), `checks` (the export and the output),
`tokenizer` (the tokenizer), `run` (the converter run and its errors), [`convert`][.convert] (the whole).
May import: checkpoints, models, core and export's result and width_format; never experts, width or above. llama.cpp's
converter and gguf-py are imported only when a conversion runs.

    python scripts/fetch_llama_cpp.py                                     # once: the converter, into the cache
    lightprune convert-gguf outputs/quickstart/model outputs/quickstart.gguf

Checked before the converter is imported, in this order, each refusal one line naming the value and what to do:

- the output: not the export nor a path inside it (symlinks resolved), then
  `check_out_file` (a file name whose folder exists, not a directory, an
  existing file only with ``overwrite``); a width-pruned export (its kernels have no GGUF form);
- the converter: ``llama_cpp``, else ``$LLAMA_CPP_DIR``, else lightprune's cache (`converter_dir`, which
  ``scripts/fetch_llama_cpp.py`` fills), with the gguf-py package it imports beside it (`find_converter`);
  ``outtype`` one of its ``--outtype`` choices and ``pre_tokenizer`` a name it writes as ``tokenizer.ggml.pre``, both
  read from its source (`converter_outtypes`, `converter_pre_tokenizers`; a close name gets a "did you
  mean");
- the weight files as the converter sees them (`converter_weight_files`: every ``model*.safetensors`` of a
  folder without a shard index): one that is not the checkpoint's own (a backup, a stray shard) is refused, naming
  it, since the converter would mix its tensors into the GGUF;
- the export, opened as every path opens a checkpoint ([`Checkpoint`][lightprune.checkpoints.reader.Checkpoint] and the
  [`Skeleton`][lightprune.checkpoints.skeleton.Skeleton] on it: the files, the shard index, every header against its
  bytes, config.json against the tensors);
- the experts per layer, counted in the weights and in config.json: llama.cpp stores one count per model
  (``<arch>.expert_count``), so an export whose layers keep different numbers is refused, naming them; its
  ``lightprune_export.json``, when there, must say what the weights hold;
- the tokenizer, whose vocabulary the converter writes into the GGUF (`check_tokenizer`): there, parseable,
  with a vocabulary (and merges for a BPE), one token per id, every id below config.json's ``vocab_size``, loadable
  by transformers as the converter loads it.

The converter then runs in this process on a file staged beside the output
(`staging_file`), renamed over it once complete: a failure (a full disk
included, numpy's short writes too) leaves nothing behind and the output as it was. A write of the staged file that
fails for want of space or permission (ENOSPC, EDQUOT, EFBIG, EACCES, EROFS, EPERM) is staging's one
`OutputDirError` line; whatever else it raises is one
`GGUFConversionError` line naming the export, the converter's step when known and the error (the traceback
under ``--verbose``). Its INFO logging, warnings and progress bar are dropped unless the run is verbose
(``LIGHTPRUNE_VERBOSE=1``, the command's ``--verbose``); the result ([`GGUFResult`][]) names the GGUF, its size
and its tensor count.

The pre-tokenizer: GGUF names it (``tokenizer.ggml.pre``), and the converter recognises a tokenizer by a fingerprint
of how it encodes a fixed text, which only published tokenizers have. A tokenizer lightprune trained (the testbeds',
``train_bpe_tokenizer``'s) is unknown to it and the converter stops ("BPE pre-tokenizer was not recognized").
``pre_tokenizer="auto"`` then names ``gpt-2`` when, and only when, ``tokenizer.json`` declares GPT-2's byte-level
pre-tokenization (`gpt2_byte_level`), which is what llama.cpp's ``gpt-2`` pre-tokenizer does; a name names
that one; ``"none"`` leaves the converter's refusal. A tokenizer the converter knows is never overridden.
"""

from lightprune.export.gguf.checks import converter_weight_files
from lightprune.export.gguf.convert import GGUFResult, convert_to_gguf
from lightprune.export.gguf.converter import (
    CONVERTER,
    LLAMA_CPP_VERSION,
    GGUFConversionError,
    converter_dir,
    converter_module,
    converter_outtypes,
    converter_pre_tokenizers,
    find_converter,
)
from lightprune.export.gguf.tokenizer import check_tokenizer, gpt2_byte_level

__all__ = ["LLAMA_CPP_VERSION", "CONVERTER", "GGUFConversionError", "GGUFResult", "converter_dir", "find_converter",
           "converter_module", "converter_outtypes", "converter_pre_tokenizers", "gpt2_byte_level",
           "converter_weight_files", "check_tokenizer", "convert_to_gguf"]

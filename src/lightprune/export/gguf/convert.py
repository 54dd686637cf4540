"""An export converted to GGUF by llama.cpp's converter: [`convert_to_gguf`][] (the order of its checks:
`lightprune.export.gguf`) and its [`GGUFResult`][]."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from lightprune.checkpoints.directory import checkpoint_directory
from lightprune.checkpoints.staging import check_out_file, staging_file
from lightprune.core.checks import check_bool
from lightprune.export.gguf.checks import check_placement, check_weight_files, checked_export, refuse_width
from lightprune.export.gguf.converter import (
    GGUFConversionError,
    choice,
    converter_module,
    converter_outtypes,
    converter_pre_tokenizers,
    find_converter,
)
from lightprune.export.gguf.run import WriteError, described, run_converter, tensor_count
from lightprune.export.gguf.tokenizer import check_tokenizer, gpt2_byte_level
from lightprune.export.width_format import WIDTH_PLAN_FILE

__all__ = ["GGUFResult", "convert_to_gguf"]


@dataclass(frozen=True)
class GGUFResult:
    """A GGUF written by [`convert_to_gguf`][]: ``path`` (absolute), ``size`` in bytes, ``tensors`` (the count its
    header holds), ``outtype``, ``pre_tokenizer`` (the ``tokenizer.ggml.pre`` lightprune named because the converter
    did not know the tokenizer; None when the converter named it), ``seconds``. ``os.PathLike``: the path."""

    path: Path
    size: int
    tensors: int
    outtype: str
    pre_tokenizer: str | None
    seconds: float

    def __fspath__(self) -> str:
        return str(self.path)

    def summary(self) -> str:
        """One line: the GGUF's path, size and tensor count (what the command prints)."""
        named = "" if self.pre_tokenizer is None else \
            f"; tokenizer.ggml.pre {self.pre_tokenizer!r} named here, llama.cpp does not know this tokenizer"
        return (f"wrote {self.path} ({self.size:,} bytes, {self.tensors} tensors, outtype {self.outtype}{named}) "
                f"in {self.seconds:.1f} s")


def convert_to_gguf(export_dir: str | os.PathLike, outfile: str | os.PathLike, *, outtype: str = "f32",
                    pre_tokenizer: str = "auto", llama_cpp: str | os.PathLike | None = None, overwrite: bool = False,
                    remedy: str = "pass overwrite=True to replace it") -> GGUFResult:
    """Convert the uniform export at ``export_dir`` to the GGUF file ``outfile`` with llama.cpp's converter (see
    the module docstring for what is checked first, and in which order).

    Args:
        export_dir: the export's folder (config.json, safetensors weights, tokenizer).
        outfile: the GGUF file to write; its folder must exist; never inside ``export_dir``.
        outtype: the converter's ``--outtype`` (``f32``, ``f16``, ``bf16``, ``q8_0``, ...: its own list).
        pre_tokenizer: ``auto``, ``none`` or a llama.cpp pre-tokenizer name (module docstring).
        llama_cpp: the folder holding ``convert_hf_to_gguf.py`` (default: ``$LLAMA_CPP_DIR``, else the fetched one).
        overwrite: replace an existing ``outfile`` once the new one is complete; ``True`` or ``False`` (anything
            else, ``"no"`` included, is refused: `check_bool`).
        remedy: the end of the error for an existing ``outfile`` (how the caller's user replaces it).

    Returns the [`GGUFResult`][]. Every refusal is one line (ValueError, FileExistsError, FileNotFoundError,
    IsADirectoryError, ...). A failed write of the staged GGUF that is a full disk or quota (ENOSPC, EDQUOT), a file
    over the size limit (EFBIG) or an unwritable file or folder (EACCES, EROFS, EPERM) is an
    `OutputDirError`; whatever else the converter raises (another write error
    included) a `GGUFConversionError` (its error as ``__cause__``).
    """
    start = time.perf_counter()
    overwrite = check_bool(overwrite, "overwrite")  # "no" is a truthy string: never read as a truth value
    export = checkpoint_directory(Path(export_dir).expanduser()).absolute()
    check_placement(export, outfile)
    out = check_out_file(outfile, overwrite, remedy)
    if os.path.lexists(export / WIDTH_PLAN_FILE):
        refuse_width(export)
    folder = find_converter(llama_cpp)
    where = f"of the --outtype choices of llama.cpp's converter in {str(folder)!r}"
    outtype = choice("outtype", outtype, converter_outtypes(folder), where)
    where = f"llama.cpp knows (the names its converter in {str(folder)!r} writes as tokenizer.ggml.pre)"
    if pre_tokenizer not in ("auto", "none"):
        pre_tokenizer = choice("pre-tokenizer", pre_tokenizer, converter_pre_tokenizers(folder), where,
                                also=("auto", "none"))
    check_weight_files(export)
    checked_export(export)
    check_tokenizer(export)
    if pre_tokenizer == "auto":
        tokenizer_json = export / "tokenizer.json"
        pre_tokenizer = "gpt-2" if tokenizer_json.is_file() and gpt2_byte_level(tokenizer_json) else "none"
        if pre_tokenizer != "none":
            choice("pre-tokenizer (auto)", pre_tokenizer, converter_pre_tokenizers(folder), where)
    kept = "is as it was" if os.path.lexists(out) else "was not created"
    try:
        with converter_module(folder) as converter, staging_file(out, overwrite, remedy) as staged:
            named = run_converter(converter, export, staged, outtype, pre_tokenizer)
            tensors = tensor_count(staged, export)
    except WriteError as err:  # a write failure staging_file does not restate (not a full disk)
        said = described(err.__cause__ or err)
        if err.errno is not None and os.strerror(err.errno) not in said:
            said += f" ({os.strerror(err.errno).lower()})"
        raise GGUFConversionError(f"llama.cpp's converter could not write the GGUF {str(out)!r}: {said}; nothing "
                                  f"was written, {str(out)!r} {kept}") from err.__cause__
    return GGUFResult(path=out, size=out.stat().st_size, tensors=tensors, outtype=outtype, pre_tokenizer=named,
                      seconds=time.perf_counter() - start)

"""``lightprune convert-gguf EXPORT OUTFILE``:
[`lightprune.export.gguf.convert_to_gguf`][lightprune.export.gguf.convert.convert_to_gguf] as a command.

`lightprune.cli.command` dispatches it before Lightning is imported. Every refusal and failure is one
``lightprune: error:`` line and exit status 2 (``--verbose``: the converter's traceback above it;
``LIGHTPRUNE_DEBUG=1``: the whole traceback); a SIGTERM or SIGINT one line and 143 or 130, as the other subcommands
(`lightprune.core.interrupt`). Quiet as they are (`lightprune.cli.quiet`): the converter's logging,
warnings and progress bar are dropped unless ``--verbose`` or ``LIGHTPRUNE_VERBOSE=1``; a conversion prints one
line, the GGUF's path, size and tensor count.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from lightprune.cli import quiet

__all__ = ["main", "parser"]

PROG = "lightprune convert-gguf"


class _Parser(argparse.ArgumentParser):
    """A bad option is one ``lightprune: error:`` line, as the other subcommands'."""

    def error(self, message: str):
        self.exit(2, f"lightprune: error: {message} (`{self.prog} --help` lists the options)\n")


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command's options (the converter's lists are checked by
    [`convert_to_gguf`][lightprune.export.gguf.convert.convert_to_gguf], not here)."""
    out = _Parser(prog=prog, description="Convert a uniform lightprune export to GGUF with llama.cpp's converter "
                  "(fetched once with `python scripts/fetch_llama_cpp.py`).")
    out.add_argument("export", help="the export's folder (config.json, safetensors weights, tokenizer)")
    out.add_argument("outfile", help="the GGUF file to write (its folder must exist; never inside the export)")
    out.add_argument("--outtype", default="f32", help="the converter's --outtype (f32, f16, bf16, q8_0, ...; "
                     "default f32)")
    out.add_argument("--pre-tokenizer", default="auto", help="auto (gpt-2 for a GPT-2 byte-level tokenizer llama.cpp "
                     "does not know), none, or a llama.cpp pre-tokenizer name")
    out.add_argument("--llama-cpp", default=None, metavar="DIR", help="the folder holding convert_hf_to_gguf.py "
                     "(default: $LLAMA_CPP_DIR, else the fetched one)")
    out.add_argument("--overwrite", action="store_true", help="replace an existing OUTFILE once the new one is "
                     "complete")
    out.add_argument("--verbose", action="store_true", help="show the converter's logging, warnings and progress "
                     "(also LIGHTPRUNE_VERBOSE=1)")
    return out


def main(argv: list[str] | None = None, prog: str = PROG) -> None:
    """Run the command on ``argv`` (default ``sys.argv[1:]``; the subcommand's name already taken off)."""
    args = parser(prog).parse_args(sys.argv[1:] if argv is None else argv)
    if args.verbose:
        os.environ[quiet.VERBOSE_ENV] = "1"  # read by the conversion (lightprune.core.notices)
    if quiet.is_verbose([]):
        quiet.remove_filters()
    else:
        quiet.install()  # before transformers is imported
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder: nothing to download
    from lightprune.core import interrupt
    from lightprune.core.errors import ERRORS

    try:
        with interrupt.installed():
            from lightprune.export.gguf import convert_to_gguf

            result = convert_to_gguf(args.export, args.outfile, outtype=args.outtype,
                                     pre_tokenizer=args.pre_tokenizer, llama_cpp=args.llama_cpp,
                                     overwrite=args.overwrite, remedy="pass --overwrite to replace it")
    except (ValueError, OSError, *ERRORS) as err:
        if os.environ.get("LIGHTPRUNE_DEBUG"):
            raise
        if err.__cause__ is not None and quiet.is_verbose([]):  # the converter's (or transformers') error
            traceback.print_exception(err.__cause__, file=sys.stderr)
        print(f"lightprune: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except interrupt.Interrupted as err:
        interrupt.exit_interrupted(err, "convert-gguf")
    print(result.summary())

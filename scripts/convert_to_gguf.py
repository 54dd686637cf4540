"""Convert a uniform lightprune export to GGUF: ``lightprune convert-gguf`` under this script's name.

    python scripts/fetch_llama_cpp.py                                   # once: the converter, into the cache
    python scripts/convert_to_gguf.py outputs/quickstart/model outputs/quickstart.gguf --outtype f32

The same options and checks (:func:`lightprune.export.gguf.convert_to_gguf` does the work, see there);
docs/guides/deployment.md shows the command.
"""

from __future__ import annotations

from lightprune.cli.convert_gguf import main

__all__ = ["main"]

if __name__ == "__main__":
    main(prog="convert_to_gguf.py")

"""Fetch llama.cpp's Hugging Face to GGUF converter from the package index, once, into lightprune's cache.

llama.cpp's converter (``convert_hf_to_gguf.py``, its ``conversion/`` package and the ``gguf-py`` it was written
with) is not on the package index as a package of its own; the source distribution of ``llama-cpp-python``
carries llama.cpp's tree. This downloads that sdist (pinned: :data:`VERSION`, ~77 MB) with pip, keeps only the
converter's files and llama.cpp's licence, and prints the folder:

    python scripts/fetch_llama_cpp.py            # -> ~/.cache/lightprune/llama.cpp/llama-cpp-python-0.3.36

Nothing is built or installed; the converter needs numpy, torch, transformers and PyYAML, which lightprune's install
brings, and sentencepiece for the models whose tokenizer it reads with it (Llama-style ones such as Mixtral, and any
export whose tokenizer is a ``tokenizer.model``), which the ``deploy`` extra brings: the last line says so when it is
missing (``pip install -e '.[deploy]'``). An existing folder is kept (a second call prints it and downloads nothing).
``--dest`` puts it elsewhere; ``LLAMA_CPP_DIR`` names a folder for the tests and ``lightprune convert-gguf`` to use
instead (a llama.cpp checkout works too). The pinned version and the cache
folder are :mod:`lightprune.export.gguf`'s, which finds the converter there.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from lightprune.export.gguf import LLAMA_CPP_VERSION as VERSION, converter_dir

__all__ = ["VERSION", "converter_dir", "fetch"]

#: the parts of llama.cpp's tree that the converter imports, and its licence
KEEP = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "LICENSE")
#: {module: package} the converter imports for some models only, which lightprune's install does not bring
OPTIONAL = {"sentencepiece": "sentencepiece"}


def fetch(dest: Path) -> Path:
    """Download the sdist, keep :data:`KEEP` under ``dest`` (renamed into place once complete); return ``dest``."""
    if (dest / "convert_hf_to_gguf.py").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".fetch-") as tmp:
        # the sdist of this one package: its build requirements (read for its metadata) stay wheels
        # (``--no-binary :all:`` built them from source too: 5.7 min instead of 8 s with an empty pip cache)
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", "llama-cpp-python",
               "--dest", tmp, f"llama-cpp-python=={VERSION}"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"pip could not download llama-cpp-python=={VERSION} (exit {done.returncode}):\n"
                             f"{done.stderr.strip()[-2000:]}")
        (sdist,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
        staging = Path(tmp) / "tree"
        with tarfile.open(sdist) as tar:
            members = []
            for member in tar.getmembers():
                rel = member.name.removeprefix(prefix)
                if member.name.startswith(prefix) and rel.startswith(KEEP) and (member.isfile() or member.isdir()):
                    member.name = rel
                    members.append(member)
            tar.extractall(staging, members=members, filter="data")
        if not (staging / "convert_hf_to_gguf.py").is_file():
            raise SystemExit(f"{sdist.name} holds no {prefix}convert_hf_to_gguf.py")
        staging.rename(dest)
    return dest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=None, help="the folder to fill (default: the cache's)")
    args = parser.parse_args(argv)
    dest = args.dest or converter_dir()
    had = (dest / "convert_hf_to_gguf.py").is_file()
    fetch(dest)
    print(f"llama.cpp converter {'already ' if had else ''}in {dest}")
    missing = [package for module, package in OPTIONAL.items() if importlib.util.find_spec(module) is None]
    if missing:
        print(f"not installed: {', '.join(missing)}, which the converter reads Llama-style models' tokenizers (Mixtral"
              f"'s) and tokenizer.model files with; pip install -e '.[deploy]' (or pip install {' '.join(missing)}) to "
              "convert those")


if __name__ == "__main__":
    main()

"""The text testbed's corpus: prose and code that ship with every CPython (nothing downloaded).

Two domains that differ sharply (a small MoE specialises by domain only when they do: on mixed text a first probe
measured a mutual information between text source and routed expert under 1% of the source's entropy; and the
calibration-data check of AIMER ("AIMER: Calibration-Free Task-Agnostic MoE Pruning", arXiv 2603.18492), appendix
D, contrasts code with web text):

- ``prose``: Python's documentation topics (``pydoc_data.topics``, the default corpus's rows,
  instruction rows joined as prompt + completion) and the docstrings of the standard library's
  modules, classes and functions;
- ``code``: the standard library's source with those docstrings removed.

Standard-library files are ``<stdlib>/**/*.py`` without tests, idlelib, lib2to3, turtledemo,
ensurepip and site-packages. The pydoc topics keep the default corpus's split; standard-library files
are taken in the SHA-256 order of their path, each whole to the split (train / val / calibration /
test, the default corpus's shares) furthest below its share of ``max_chars`` per domain; a file gives
its code while its split's code is below that share and its docstrings while the split's prose is
(the pydoc topics count first), until every split is full or the files run out. So no text is in two
splits. Rows are ``{"text", "domain", "source"}`` of at most about
``chunk_chars`` characters, cut at blank lines (code) or paragraph ends (prose).

`build_text_corpus` writes ``{train,val,calibration,test}.jsonl``, one
``calibration-<domain>.jsonl`` per domain and a BPE tokenizer trained on the train split into
``<root>/testbed/corpus-<digest>/`` (the default corpus's cache helpers: written under a temporary
name, renamed into place, checked against a manifest, rebuilt with a warning when corrupt).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lightprune.core.jsonio import parse_json
from lightprune.data.cache import CacheError, build_folder, check_folder, write_manifest
from lightprune.data.pydoc_rows import SPLIT_SHARES, corpus_splits
from lightprune.data.rows import read_jsonl
from lightprune.data.tokenizer import train_bpe_tokenizer
from lightprune.testbed.training import cache_root

__all__ = ["DOMAINS", "TEXT_CORPUS_FORMAT", "TextCorpus", "TextCorpusSpec", "build_text_corpus",
           "rows_by_domain", "stdlib_files", "text_corpus_rows"]

TEXT_CORPUS_FORMAT = "v1"  # bump when the rows, the split rule or the tokenizer recipe change
DOMAINS: tuple[str, ...] = ("prose", "code")
_SKIP_DIRS = frozenset({"test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages",
                        "__pycache__"})
_MIN_DOCSTRING = 80


@dataclass(frozen=True)
class TextCorpusSpec:
    """What the corpus holds: ``max_chars`` per domain, row size, and the tokenizer's vocabulary."""

    max_chars: int = 2_000_000
    chunk_chars: int = 1000
    vocab_size: int = 4096

    def __post_init__(self):
        for name in ("max_chars", "chunk_chars"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 100:
                raise ValueError(f"{name} must be an int >= 100, got {getattr(self, name)!r}")
        if not isinstance(self.vocab_size, int) or self.vocab_size < 300:
            raise ValueError(f"vocab_size must be an int >= 300 (the 256 bytes and the specials), "
                             f"got {self.vocab_size!r}")


@dataclass(frozen=True)
class TextCorpus:
    """A built corpus folder: ``files[split]`` (JSONL), ``tokenizer_dir`` and the manifest."""

    root: Path
    files: dict[str, Path]
    tokenizer_dir: Path
    manifest: dict[str, Any]

    def jsonl_args(self, calibration_domain: str | None = None) -> dict[str, str]:
        """TextJsonlDataModule's tokenizer and split files; calibration from one domain's rows when given."""
        if calibration_domain is not None and calibration_domain not in DOMAINS:
            raise ValueError(f"calibration_domain must be None or one of {list(DOMAINS)}, got {calibration_domain!r}")
        calibration = "calibration" if calibration_domain is None else f"calibration-{calibration_domain}"
        return {"tokenizer": str(self.tokenizer_dir), "calibration": str(self.files[calibration]),
                **{split: str(self.files[split]) for split in ("train", "val", "test")}}


def stdlib_files() -> list[tuple[str, Path]]:
    """``(relative path, path)`` of the standard library's ``.py`` files, tests and tools excluded, sorted."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(lib.rglob("*.py")):
        rel = path.relative_to(lib)
        if not _SKIP_DIRS.intersection(rel.parts):
            out.append((rel.as_posix(), path))
    if not out:
        raise RuntimeError(f"no standard-library sources found under {lib}; the text testbed needs them")
    return out


def _chunks(pieces: list[str], limit: int, sep: str) -> Iterator[str]:
    """Join consecutive pieces with ``sep`` into chunks of at most ``limit`` characters (a longer piece alone)."""
    current = ""
    for piece in pieces:
        piece = piece.strip("\n")
        if not piece.strip():
            continue
        if current and len(current) + len(sep) + len(piece) > limit:
            yield current
            current = ""
        current = f"{current}{sep}{piece}" if current else piece
        while len(current) > limit:  # a single overlong piece: cut at a line end when there is one
            cut = current.rfind("\n", 0, limit)
            cut = cut if cut > limit // 4 else limit
            yield current[:cut]
            current = current[cut:].lstrip("\n")
    if current:
        yield current


def _split_source(text: str) -> tuple[list[str], str]:
    """(docstrings, the source with those docstring statements blanked out)."""
    tree = ast.parse(text)
    lines = text.split("\n")
    docs = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        if not doc:
            continue
        stmt = node.body[0]
        if len(doc) >= _MIN_DOCSTRING:
            docs.append(doc)
        for i in range(stmt.lineno - 1, stmt.end_lineno):
            lines[i] = ""
    code = "\n".join(lines)
    while "\n\n\n" in code:
        code = code.replace("\n\n\n", "\n\n")
    return docs, code


def text_corpus_rows(spec: TextCorpusSpec) -> dict[str, list[dict[str, str]]]:
    """``{split: rows}``, rows ``{"text", "domain", "source"}`` (see the module docstring), in memory."""
    splits: dict[str, list[dict[str, str]]] = {split: [] for split in SPLIT_SHARES}
    for split, rows in corpus_splits().items():  # the pydoc topics keep the default corpus's split
        taken = 0
        for row in rows:
            if taken >= SPLIT_SHARES[split] * spec.max_chars:
                break
            text = row["text"] if "text" in row else row["prompt"] + row["completion"]
            splits[split].append({"text": text, "domain": "prose", "source": f"pydoc:{row['topic']}"})
            taken += len(text)
    prose_taken = {split: sum(len(r["text"]) for r in rows) for split, rows in splits.items()}
    code_taken = {split: 0 for split in SPLIT_SHARES}
    files = sorted(stdlib_files(), key=lambda rp: hashlib.sha256(rp[0].encode()).hexdigest())
    budget = {split: share * spec.max_chars for split, share in SPLIT_SHARES.items()}
    for rel, path in files:  # each file to the split furthest below its share of both domains
        split = max(SPLIT_SHARES, key=lambda s: 2 * budget[s] - code_taken[s] - prose_taken[s])
        want_code, want_prose = code_taken[split] < budget[split], prose_taken[split] < budget[split]
        if not (want_code or want_prose):
            break
        try:
            docs, code = _split_source(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        doc_rows = list(_chunks(docs, spec.chunk_chars, "\n\n")) if want_prose else []
        code_rows = list(_chunks(code.split("\n\n"), spec.chunk_chars, "\n\n")) if want_code else []
        splits[split] += [{"text": t, "domain": "prose", "source": f"stdlib:{rel}"} for t in doc_rows]
        splits[split] += [{"text": t, "domain": "code", "source": f"stdlib:{rel}"} for t in code_rows]
        prose_taken[split] += sum(map(len, doc_rows))
        code_taken[split] += sum(map(len, code_rows))
    for split, rows in splits.items():  # a mix of sources from the first rows on
        rows.sort(key=lambda r: hashlib.sha256(f"{r['source']}/{r['text']}".encode()).hexdigest())
    return splits


def _digest(spec: TextCorpusSpec) -> str:
    key = {"format": TEXT_CORPUS_FORMAT, "spec": asdict(spec), "python": list(sys.version_info[:3])}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def _write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _fill(spec: TextCorpusSpec):
    def fill(folder: Path) -> None:
        splits = text_corpus_rows(spec)
        for split, rows in splits.items():
            _write_jsonl(folder / f"{split}.jsonl", rows)
        for domain in DOMAINS:
            _write_jsonl(folder / f"calibration-{domain}.jsonl",
                         [r for r in splits["calibration"] if r["domain"] == domain])
        tokenizer = train_bpe_tokenizer((r["text"] for r in splits["train"]), spec.vocab_size,
                                        model_max_length=1 << 16)
        tokenizer.save_pretrained(str(folder / "tokenizer"))
        stats = {split: {d: {"rows": sum(r["domain"] == d for r in rows),
                             "chars": sum(len(r["text"]) for r in rows if r["domain"] == d)} for d in DOMAINS}
                 for split, rows in splits.items()}
        write_manifest(folder, {"format": TEXT_CORPUS_FORMAT, "spec": asdict(spec), "splits": stats,
                                 "python": sys.version.split()[0], "tokenizer_len": len(tokenizer)})

    return fill


def _files(folder: Path) -> dict[str, Path]:
    names = [*SPLIT_SHARES, *(f"calibration-{d}" for d in DOMAINS)]
    return {name: folder / f"{name}.jsonl" for name in names}


def build_text_corpus(spec: TextCorpusSpec | None = None, root: str | os.PathLike | None = None) -> TextCorpus:
    """The corpus folder of ``spec`` under ``root`` (``$LIGHTPRUNE_CACHE``, ``~/.cache/lightprune``), built if
    absent."""
    spec = spec or TextCorpusSpec()
    folder = cache_root(root) / "testbed" / f"corpus-{_digest(spec)}"
    expect = {"format": TEXT_CORPUS_FORMAT, "spec": asdict(spec)}
    required = tuple(p.name for p in _files(folder).values())
    try:
        manifest = check_folder(folder, expect, required)
        _check_tokenizer(folder)
    except CacheError as e:
        if folder.exists():
            from lightning.pytorch.utilities.rank_zero import rank_zero_warn

            rank_zero_warn(f"rebuilding the testbed corpus {folder}: {e}")
        build_folder(folder, _fill(spec), replace=folder.exists())
        manifest = check_folder(folder, expect, required)
    return TextCorpus(folder, _files(folder), folder / "tokenizer", manifest)


def rows_by_domain(path: Path) -> dict[str, list]:
    """A corpus JSONL file's rows (`Row`) per domain, in file order."""
    rows = read_jsonl(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    domains = [parse_json(line, f"{path}:{number}")["domain"] for number, line in enumerate(lines, start=1)]
    return {domain: [r for r, d in zip(rows, domains) if d == domain] for domain in DOMAINS}


def _check_tokenizer(folder: Path) -> None:
    if not (folder / "tokenizer" / "tokenizer.json").is_file():
        raise CacheError(f"{folder / 'tokenizer' / 'tokenizer.json'} is missing")

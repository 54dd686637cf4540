"""The embedded default data: a corpus from Python's own documentation and a tokenizer trained on it.

Nothing is downloaded. `lightprune.data.pydoc_rows` turns the standard library's
``pydoc_data.topics`` into instruction (prompt/completion) and text rows split by topic into
train / val / calibration / test; this module caches them as JSONL with a byte-level BPE
tokenizer trained locally on the train split, and `DefaultCorpusDataModule` serves them
exactly as `TextJsonlDataModule` serves any JSONL files.

Cache: ``<root>/default_corpus/<version>/`` holds ``{train,val,calibration,test}.jsonl``,
``manifest.json`` (SHA-256 and size of every file, rows and topics per split) and one
``tokenizer-<vocab_size>/`` per vocabulary size (pad, eos, bos, unk at ids 0-3, then the ChatML
markers, the 256 bytes and the merges; its own manifest). ``root`` is ``cache_dir``, else
``$LIGHTPRUNE_CACHE``, else ``~/.cache/lightprune``; ``version`` names the format, the Python
version and a digest of the topics, so another Python gets its own folder. Each folder is
written under a temporary name and renamed into place: a reader never sees half a cache, and
concurrent builders (which write identical bytes) are safe. A folder that fails its manifest
(a truncated or edited file) is rebuilt by `build_default_corpus`, with a warning, and
reported by `load_default_corpus`, which never writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from lightprune.core.jsonio import parse_json
from lightprune.data.base import check_loader_args
from lightprune.data.cache import CacheError, build_folder, check_folder, sha256_file, write_manifest
from lightprune.data.pydoc_rows import SPLIT_SHARES, corpus_splits, python_topics
from lightprune.data.text import TextJsonlDataModule
from lightprune.data.tokenizer import train_bpe_tokenizer

__all__ = ["CORPUS_FORMAT", "DefaultCorpus", "DefaultCorpusDataModule", "DefaultCorpusError", "build_default_corpus",
           "corpus_version", "default_corpus_dir", "default_model_overrides", "load_default_corpus"]

CORPUS_FORMAT = "v1"  # bump when the rows, the split rule or the tokenizer recipe change
_CORPUS_FILES = tuple(f"{split}.jsonl" for split in SPLIT_SHARES)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


#: the default corpus cache is missing or corrupt (a :class:`~lightprune.data.cache.CacheError`)
DefaultCorpusError = CacheError


# -- the cache -------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _topics_digest() -> str:
    return hashlib.sha256(json.dumps(python_topics(), sort_keys=True).encode()).hexdigest()


def corpus_version() -> str:
    """``<format>-py<major><minor>-<digest of the topics>``: the cache folder's name."""
    return f"{CORPUS_FORMAT}-py{sys.version_info[0]}{sys.version_info[1]}-{_topics_digest()[:12]}"


def default_corpus_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """``<cache_dir or $LIGHTPRUNE_CACHE or ~/.cache/lightprune>/default_corpus/<version>``."""
    root = cache_dir or os.environ.get("LIGHTPRUNE_CACHE") or Path.home() / ".cache" / "lightprune"
    return Path(root).expanduser() / "default_corpus" / corpus_version()


@dataclass(frozen=True)
class DefaultCorpus:
    """A validated cache folder: ``files[split]`` (JSONL paths), ``tokenizer_dir`` and the manifest."""

    root: Path
    files: dict[str, Path]
    tokenizer_dir: Path | None
    manifest: dict[str, Any]


def _corpus_expect() -> dict[str, Any]:
    return {"format": CORPUS_FORMAT, "version": corpus_version()}


def _fill_corpus(folder: Path) -> None:
    splits = corpus_splits()
    for split, rows in splits.items():
        with (folder / f"{split}.jsonl").open("w", encoding="utf-8", newline="\n") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    topics = {s: sorted({r["topic"] for r in rows}) for s, rows in splits.items()}
    write_manifest(folder, {**_corpus_expect(), "rows": {s: len(r) for s, r in splits.items()}, "topics": topics,
                             "python": sys.version.split()[0]})


def _tokenizer_texts(train: Path) -> list[str]:
    texts = []
    for number, line in enumerate(train.read_text(encoding="utf-8").splitlines(), start=1):
        row = parse_json(line, f"{train}:{number}")
        texts += [row["text"]] if "text" in row else [row["prompt"], row["completion"]]
    return texts


def _fill_tokenizer(train: Path, vocab_size: int, expect: dict[str, Any]):
    def fill(folder: Path) -> None:
        tokenizer = train_bpe_tokenizer(_tokenizer_texts(train), vocab_size, model_max_length=1 << 16)
        tokenizer.save_pretrained(str(folder))
        write_manifest(folder, {**expect, "len": len(tokenizer)})

    return fill


def _warn(message: str) -> None:
    from lightning.pytorch.utilities.rank_zero import rank_zero_warn

    rank_zero_warn(message)


def build_default_corpus(cache_dir: str | os.PathLike | None = None, *, vocab_size: int | None = 2048,
                         ) -> DefaultCorpus:
    """Write the corpus (and the tokenizer of ``vocab_size``; ``None``: none) unless a valid cache exists.

    A corrupt cache (a truncated file, a bad manifest) is rebuilt, with a warning naming the file.
    """
    root = default_corpus_dir(cache_dir)
    try:
        check_folder(root, _corpus_expect(), _CORPUS_FILES)
    except DefaultCorpusError as e:
        if root.exists():
            _warn(f"rebuilding the default corpus cache: {e}")
        build_folder(root, _fill_corpus, replace=root.exists())
    if vocab_size is not None:
        tok_dir = root / f"tokenizer-{vocab_size}"
        expect = _tokenizer_expect(root, vocab_size)
        try:
            check_folder(tok_dir, expect, _TOKENIZER_FILES)
        except DefaultCorpusError as e:
            if tok_dir.exists():
                _warn(f"rebuilding the default corpus tokenizer: {e}")
            build_folder(tok_dir, _fill_tokenizer(root / "train.jsonl", vocab_size, expect),
                          replace=tok_dir.exists())
    return load_default_corpus(cache_dir, vocab_size=vocab_size)


def _tokenizer_expect(root: Path, vocab_size: int) -> dict[str, Any]:
    return {"vocab_size": vocab_size, "train_sha256": sha256_file(root / "train.jsonl")}


def load_default_corpus(cache_dir: str | os.PathLike | None = None, *, vocab_size: int | None = 2048,
                        ) -> DefaultCorpus:
    """The cached corpus (and tokenizer), checked against its manifests; never writes.

    Raises `DefaultCorpusError` naming the missing or corrupt file; build the cache with
    `build_default_corpus` (``DefaultCorpusDataModule.prepare_data`` does).
    """
    root = default_corpus_dir(cache_dir)
    hint = " (build it with lightprune.data.build_default_corpus, or DefaultCorpusDataModule.prepare_data)"
    try:
        manifest = check_folder(root, _corpus_expect(), _CORPUS_FILES)
        tok_dir = None
        if vocab_size is not None:
            tok_dir = root / f"tokenizer-{vocab_size}"
            check_folder(tok_dir, _tokenizer_expect(root, vocab_size), _TOKENIZER_FILES)
    except DefaultCorpusError as e:
        raise DefaultCorpusError(f"{e}{hint}") from None
    return DefaultCorpus(root, {s: root / f"{s}.jsonl" for s in SPLIT_SHARES}, tok_dir, manifest)


# -- the datamodule ----------------------------------------------------------------------------
class DefaultCorpusDataModule(pl.LightningDataModule):
    """`TextJsonlDataModule` over the default corpus and its local tokenizer.

    ``prepare_data`` builds the cache when it is absent or corrupt (Lightning runs it on one
    process per node); ``setup`` under a Trainer only reads it, and reports a missing or corrupt
    cache (without a Trainer, nothing calls ``prepare_data``, so ``setup`` prepares first). Then
    every split, loader and batch is exactly TextJsonlDataModule's: prompt tokens are -100 in
    ``labels``, rows end with the eos token (``add_eos``), ``train`` is shuffled by ``seed``.

    Outside a Trainer (a notebook, or to size a model before fitting), ``tokenizer``,
    ``vocab_size_needed``, ``model_overrides`` and the loaders prepare the cache on first use;
    that is safe on every rank at once (folders are renamed into place, and every builder writes
    the same bytes).

    Args:
        vocab_size: size of the BPE vocabulary trained on the train split (special tokens included).
        max_length: keep the first ``max_length`` tokens of each row.
        batch_size: rows per batch.
        num_samples: keep the first ``num_samples`` rows of each split (``None``: all).
        cache_dir: cache root (default ``$LIGHTPRUNE_CACHE`` or ``~/.cache/lightprune``); the files go
            to ``<cache_dir>/default_corpus/<version>/``.
        seed: seed of the train shuffle (the corpus itself does not depend on it).
        mask_prompt, add_eos, padding_side, num_workers: as in TextJsonlDataModule.
    """

    def __init__(self, vocab_size: int = 2048, max_length: int | None = 128, batch_size: int = 8,
                 num_samples: int | None = None, cache_dir: str | None = None, seed: int = 0, *,
                 mask_prompt: bool = True, add_eos: bool = True, padding_side: str = "right", num_workers: int = 0):
        super().__init__()
        if not isinstance(vocab_size, int) or vocab_size < 64:
            raise ValueError(f"vocab_size must be an int >= 64, got {vocab_size!r}")
        check_loader_args(max_length=max_length, batch_size=batch_size, padding_side=padding_side,
                          num_samples=num_samples, num_workers=num_workers)
        self.save_hyperparameters()
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.batch_size = batch_size
        self.num_samples = num_samples
        self.cache_dir = cache_dir
        self.seed = seed
        self.corpus: DefaultCorpus | None = None
        self._inner = None

    # -- Lightning hooks -------------------------------------------------------------------------
    def prepare_data(self) -> None:
        build_default_corpus(self.cache_dir, vocab_size=self.vocab_size)

    def setup(self, stage: str | None = None) -> None:
        if self._inner is None:
            if self.trainer is None:  # no Trainer, so no prepare_data call (a notebook)
                self.text_datamodule()
            else:  # the Trainer ran prepare_data: only read, on every rank
                self._attach(load_default_corpus(self.cache_dir, vocab_size=self.vocab_size))
        self._inner.setup(stage)

    def _attach(self, corpus: DefaultCorpus) -> None:
        h = self.hparams
        self.corpus = corpus
        self._inner = TextJsonlDataModule(
            str(corpus.tokenizer_dir), calibration=str(corpus.files["calibration"]), train=str(corpus.files["train"]),
            val=str(corpus.files["val"]), test=str(corpus.files["test"]), max_length=self.max_length,
            batch_size=self.batch_size, padding_side=h.padding_side, mask_prompt=h.mask_prompt, add_eos=h.add_eos,
            num_samples=self.num_samples, seed=self.seed, num_workers=h.num_workers)

    def text_datamodule(self):
        """The inner TextJsonlDataModule (the cache is prepared on first use outside a Trainer)."""
        if self._inner is None:
            self._attach(build_default_corpus(self.cache_dir, vocab_size=self.vocab_size))
        return self._inner

    # -- what a model is sized by ----------------------------------------------------------------
    @property
    def tokenizer(self):
        return self.text_datamodule().tokenizer

    @property
    def vocab_size_needed(self) -> int:
        """``len(tokenizer)``: the smallest model vocabulary that holds every id."""
        return len(self.tokenizer)

    @property
    def model_overrides(self) -> dict[str, int]:
        """`default_model_overrides` of this datamodule."""
        return default_model_overrides(self)

    # -- TextJsonlDataModule's interface -----------------------------------------------------------
    def dataset(self, split: str):
        return self.text_datamodule().dataset(split)

    def encode_rows(self, rows):
        return self.text_datamodule().encode_rows(rows)

    def train_dataloader(self):
        return self.text_datamodule().train_dataloader()

    def val_dataloader(self):
        return self.text_datamodule().val_dataloader()

    def test_dataloader(self):
        return self.text_datamodule().test_dataloader()

    def calibration_dataloader(self):
        """Calibration batches in file order."""
        return self.text_datamodule().calibration_dataloader()


def default_model_overrides(source: Any) -> dict[str, int]:
    """Config overrides that fit a tiny model to a tokenizer: ``tiny_model(family, **overrides)``.

    ``source``: a `DefaultCorpusDataModule` (or anything with a ``tokenizer``) or a
    tokenizer. Gives ``vocab_size`` (``len(tokenizer)``), ``pad_token_id``, ``eos_token_id``,
    ``bos_token_id`` and, when ``source`` has a ``max_length``, ``max_position_embeddings``
    (at least 128, the tiny configs' value).
    """
    tokenizer = getattr(source, "tokenizer", source)
    out = {"vocab_size": len(tokenizer)}
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            out[name] = int(value)
    max_length = getattr(source, "max_length", None)
    if isinstance(max_length, int):
        out["max_position_embeddings"] = max(128, max_length)
    return out

"""TextJsonlDataModule: calibration / train / val / test batches from local JSONL text files.

Rows are ``{"text"}``, ``{"prompt", "completion"}`` or ``{"messages"}`` (see
`lightprune.data.rows`); masking rules are in `lightprune.data.segments`. Every
split is tokenised once, when first used, in batches, with a progress bar for large files.
Batches are dicts of ``input_ids``, ``attention_mask`` and ``labels`` (-100 where no loss is
taken: prompts, non-assistant turns, padding), ready for ``model(**batch)`` and for
`lightprune.finetune.MoECausalLM`.

The tokenizer is a local directory (``AutoTokenizer.from_pretrained(path,
local_files_only=True)``; nothing is downloaded) or a tokenizer object, e.g. from
`lightprune.data.train_bpe_tokenizer`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from lightprune.core.jsonio import parse_json
from lightprune.core.sources import resolve_checkpoint
from lightprune.data.base import JsonlDataModule
from lightprune.data.collate import Collator
from lightprune.data.rows import Row
from lightprune.data.segments import chat_renderer, row_segments, special_affixes

__all__ = ["check_tokenizer_dir", "TOKENIZER_FILES", "TextJsonlDataModule", "load_tokenizer"]

_CHUNK = 512  # rows tokenised per batched tokenizer call
_PROGRESS_MIN_ROWS = 2000


def load_tokenizer(tokenizer: Any):
    """A tokenizer object, or one loaded from a local directory (never from a hub) or a checkpoint source's
    (``testbed:text-small``: the testbed's own tokenizer, `lightprune.core.sources`)."""
    if isinstance(tokenizer, (str, os.PathLike)):
        path = resolve_checkpoint(str(Path(tokenizer).expanduser()))
        if not path.is_dir():
            raise FileNotFoundError(f"tokenizer directory {str(path)!r} does not exist (lightprune loads "
                                    "tokenizers from local directories only; nothing is downloaded)")
        from transformers import AutoTokenizer

        check_tokenizer_dir(path, "tokenizer")
        try:
            return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as err:  # noqa: BLE001 - every loader failure is the same answer: name the folder
            raise ValueError(f"tokenizer directory {str(path)!r} cannot be loaded: {type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else ''}") from None
    if not callable(tokenizer):
        raise TypeError(f"tokenizer must be a local directory or a tokenizer object, got {type(tokenizer).__name__}")
    return tokenizer


#: files one of which a tokenizer directory holds
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model", "sentencepiece.bpe.model")


def check_tokenizer_dir(path: Path, what: str) -> None:
    """``path`` holds tokenizer files, and its ``tokenizer.json`` (if any) is valid JSON; errors name the file."""
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"{what} directory {str(path)!r} has no tokenizer files (none of "
                                f"{', '.join(TOKENIZER_FILES)}): transformers would build an empty tokenizer")
    file = path / "tokenizer.json"
    if file.is_file():
        try:
            parse_json(file.read_bytes().decode("utf-8"), f"tokenizer file {str(file)!r}")
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{str(file)!r} is not valid JSON ({err}): the tokenizer file is damaged") from None


def pad_token_id(tokenizer) -> int:
    """The tokenizer's pad id, else its eos id; an error when it has neither."""
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    raise ValueError("the tokenizer has neither a pad token nor an eos token to pad batches with; set pad_token")


class TokenizedDataset(Dataset):
    """Rows already tokenised: ``input_ids`` and ``labels`` (1-D long tensors) per row."""

    def __init__(self, samples: list[dict[str, torch.Tensor]]):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.samples[index]


class TextJsonlDataModule(JsonlDataModule):
    """Text batches from local JSONL files.

    Args:
        tokenizer: local tokenizer directory, or a tokenizer object.
        calibration, train, val, test: JSONL files (any may be omitted; at least one is given).
        max_length: keep the first ``max_length`` tokens of each row (``None``: no limit).
        batch_size: rows per batch; batches are padded to their longest row.
        padding_side: ``"right"`` or ``"left"``.
        pad_to_multiple_of: round the padded length up to a multiple of this.
        mask_prompt: labels only on completions and assistant turns (else on every token).
        add_eos: end text and prompt/completion rows with the eos token (a label) when the
            tokenizer does not already.
        num_samples: keep the first ``num_samples`` rows of each file.
        seed: seed of the train shuffle.
        num_workers: DataLoader workers.
        progress: progress bars while reading and tokenising (``None``: for large files).
    """

    def __init__(self, tokenizer: Any, calibration: str | None = None, train: str | None = None,
                 val: str | None = None, test: str | None = None, *, max_length: int | None = 2048,
                 batch_size: int = 8, padding_side: str = "right", pad_to_multiple_of: int | None = None,
                 mask_prompt: bool = True, add_eos: bool = False, num_samples: int | None = None, seed: int = 0,
                 num_workers: int = 0, progress: bool | None = None):
        super().__init__(calibration, train, val, test, max_length=max_length, batch_size=batch_size,
                         padding_side=padding_side, pad_to_multiple_of=pad_to_multiple_of, mask_prompt=mask_prompt,
                         num_samples=num_samples, seed=seed, num_workers=num_workers, progress=progress)
        self.save_hyperparameters(ignore=[] if isinstance(tokenizer, (str, os.PathLike)) else ["tokenizer"])
        self.tokenizer = load_tokenizer(tokenizer)
        self.pad_id = pad_token_id(self.tokenizer)
        self.add_eos = add_eos
        self._render = chat_renderer(self.tokenizer, "tokenizer")
        self._prefix, self._suffix = special_affixes(self.tokenizer)

    def _collator(self) -> Collator:
        return Collator(self.pad_id, self.padding_side, self.pad_to_multiple_of)

    def encode_rows(self, rows: list[Row]) -> list[dict[str, torch.Tensor]]:
        """Tokenise rows into ``{"input_ids", "labels"}`` (truncated to ``max_length``)."""
        plans = [row_segments(row, self._render, self.mask_prompt) for row in rows]
        texts = [s.text for segments, _ in plans for s in segments]
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        eos = getattr(self.tokenizer, "eos_token_id", None)
        out, k = [], 0
        for segments, affixes in plans:
            input_ids: list[int] = list(self._prefix) if affixes else []
            labels: list[int] = [-100] * len(input_ids)
            for segment in segments:
                piece = list(ids[k])
                k += 1
                input_ids += piece
                labels += piece if segment.trainable else [-100] * len(piece)
            if affixes:
                input_ids += self._suffix
                labels += self._suffix
                if self.add_eos and eos is not None and (not input_ids or input_ids[-1] != eos):
                    input_ids.append(eos)
                    labels.append(eos)
            if self.max_length is not None:
                input_ids, labels = input_ids[:self.max_length], labels[:self.max_length]
            out.append({"input_ids": torch.tensor(input_ids, dtype=torch.long),
                        "labels": torch.tensor(labels, dtype=torch.long)})
        return out

    def _dataset_from_rows(self, split: str, rows: list[Row]) -> TokenizedDataset:
        show = len(rows) >= _PROGRESS_MIN_ROWS if self.progress is None else self.progress
        bar = None
        if show:
            from lightning.pytorch.utilities.rank_zero import rank_zero_only
            from tqdm.auto import tqdm

            bar = tqdm(total=len(rows), unit="rows", desc=f"tokenising {split}", leave=False,
                       disable=rank_zero_only.rank != 0)
        samples: list[dict[str, torch.Tensor]] = []
        try:
            for start in range(0, len(rows), _CHUNK):
                chunk = rows[start:start + _CHUNK]
                samples += self.encode_rows(chunk)
                if bar is not None:
                    bar.update(len(chunk))
        finally:
            if bar is not None:
                bar.close()
        empty = [r for r, s in zip(rows, samples) if len(s["input_ids"]) == 0]
        if empty:
            raise ValueError(f"{empty[0].source}: the row tokenises to no tokens ({len(empty)} such rows in {split})")
        self._warn_unlabelled(split, sum(int((s["labels"] != -100).sum()) == 0 for s in samples), len(samples))
        return TokenizedDataset(samples)

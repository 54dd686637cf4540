"""JsonlDataModule: the split handling that the text and image+text datamodules share.

Four splits, each a local JSONL file given to the constructor: ``calibration``, ``train``,
``val`` and ``test``. The files are checked at construction (a missing one names its path)
and read on first use, or in ``setup`` for the splits its stage needs (``fit``: train and
val; ``validate``: val; ``test``: test; ``calibrate``: calibration). ``num_samples`` keeps the
first rows of every split, in file order. Only ``train`` is shuffled, by a generator seeded
with ``seed``; the other loaders (``calibration_dataloader`` included) keep file order, so
calibration sees the same batches on every run. Without a ``calibration`` file,
``calibration_dataloader`` reads ``train`` in file order. A loader whose file was not given is
an empty list, which Lightning skips.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.utils.data import DataLoader, Dataset

from lightprune.data.collate import PADDING_SIDES, Collator
from lightprune.data.rows import Row, read_jsonl

__all__ = ["SPLITS", "JsonlDataModule", "check_loader_args"]


def check_loader_args(*, max_length: int | None, batch_size: int, padding_side: str, num_samples: int | None,
                      num_workers: int, pad_to_multiple_of: int | None = None) -> None:
    """The batching arguments every datamodule shares, checked at construction; errors name the value."""
    checks = {"max_length": (max_length, True), "batch_size": (batch_size, False),
              "num_samples": (num_samples, True), "pad_to_multiple_of": (pad_to_multiple_of, True)}
    for name, (value, optional) in checks.items():
        if not (value is None and optional) and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be an int >= 1{' or None' if optional else ''}, got {value!r}")
    if padding_side not in PADDING_SIDES:
        raise ValueError(f"padding_side must be one of {PADDING_SIDES}, got {padding_side!r}")
    if not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an int >= 0, got {num_workers!r}")

SPLITS = ("calibration", "train", "val", "test")
_STAGE_SPLITS = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": (),
                 "calibrate": ("calibration",)}


class JsonlDataModule(pl.LightningDataModule):
    """Base class; subclasses define `_dataset_from_rows`, `_collator` and ``allow_images``."""

    allow_images = False

    def __init__(self, calibration: str | None, train: str | None, val: str | None, test: str | None, *,
                 max_length: int | None, batch_size: int, padding_side: str, pad_to_multiple_of: int | None,
                 mask_prompt: bool, num_samples: int | None, seed: int, num_workers: int,
                 progress: bool | None):
        super().__init__()
        self.paths: dict[str, Path | None] = {}
        for split, path in zip(SPLITS, (calibration, train, val, test)):
            if path is not None:
                path = Path(path).expanduser()
                if not path.is_file():
                    raise FileNotFoundError(f"{split} JSONL file {str(path)!r} does not exist")
            self.paths[split] = path
        if not any(self.paths.values()):
            raise ValueError(f"give at least one JSONL file: {', '.join(f'{s}=' for s in SPLITS)}")
        check_loader_args(max_length=max_length, batch_size=batch_size, padding_side=padding_side,
                          pad_to_multiple_of=pad_to_multiple_of, num_samples=num_samples, num_workers=num_workers)
        self.max_length = max_length
        self.batch_size = batch_size
        self.padding_side = padding_side
        self.pad_to_multiple_of = pad_to_multiple_of
        self.mask_prompt = mask_prompt
        self.num_samples = num_samples
        self.seed = seed
        self.num_workers = num_workers
        self.progress = progress
        self._datasets: dict[str, Dataset] = {}

    # -- subclass hooks ---------------------------------------------------------------------
    def _dataset_from_rows(self, split: str, rows: list[Row]) -> Dataset:
        raise NotImplementedError

    def _collator(self) -> Collator:
        raise NotImplementedError

    # -- splits ------------------------------------------------------------------------------
    def _source(self, split: str) -> str | None:
        if split == "calibration" and self.paths["calibration"] is None:
            return "train" if self.paths["train"] is not None else None
        return split if self.paths[split] is not None else None

    def dataset(self, split: str) -> Dataset | None:
        """The split's dataset (read and validated on first use), or ``None`` without a file."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        source = self._source(split)
        if source is None:
            return None
        if source not in self._datasets:
            rows = read_jsonl(self.paths[source], limit=self.num_samples, allow_images=self.allow_images,
                              progress=self.progress, desc=f"{source}: {self.paths[source].name}")
            self._datasets[source] = self._dataset_from_rows(source, rows)
        return self._datasets[source]

    def setup(self, stage: str | None = None) -> None:
        splits = SPLITS if stage is None else _STAGE_SPLITS.get(stage, ())
        for split in splits:
            self.dataset(split)

    def _loader(self, split: str, shuffle: bool) -> DataLoader | list:
        dataset = self.dataset(split)
        if dataset is None:
            if split in ("train", "calibration"):
                raise ValueError(f"no {split} data: pass {split}= (a JSONL file)"
                                 + (" or train=" if split == "calibration" else ""))
            return []
        generator = torch.Generator().manual_seed(self.seed) if shuffle else None
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=shuffle, generator=generator,
                          collate_fn=self._collator(), num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader | list:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader | list:
        return self._loader("test", shuffle=False)

    def calibration_dataloader(self) -> DataLoader:
        """Calibration batches in file order (``train`` when no calibration file was given)."""
        return self._loader("calibration", shuffle=False)

    # -- shared helpers ----------------------------------------------------------------------
    def _warn_unlabelled(self, split: str, count: int, total: int) -> None:
        if count and split != "calibration":
            rank_zero_warn(f"{split}: {count} of {total} rows have no label tokens (prompt only, no assistant "
                           f"turn, or cut by max_length={self.max_length}); they add nothing to the loss")

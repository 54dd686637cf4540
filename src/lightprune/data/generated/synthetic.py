"""SyntheticTokens: seeded random token sequences, for smoke runs of fit/validate/test/calibrate.

No text is needed to score experts from weights; this datamodule only exercises the loops on
a tiny model. Real text and image+text datamodules come with the calibration work.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

__all__ = ["SyntheticTokens"]


class SyntheticTokens(pl.LightningDataModule):
    """``num_samples`` sequences of ``seq_len`` ids drawn uniformly from [low, high), seeded."""

    def __init__(self, num_samples: int = 8, seq_len: int = 16, batch_size: int = 2, low: int = 3,
                 high: int = 100, seed: int = 0):
        super().__init__()
        if num_samples < 1 or seq_len < 2 or batch_size < 1:
            raise ValueError(f"need num_samples >= 1, seq_len >= 2, batch_size >= 1; got "
                             f"{num_samples}, {seq_len}, {batch_size}")
        if not 0 <= low < high:
            raise ValueError(f"need 0 <= low < high, got low={low}, high={high}")
        self.save_hyperparameters()

    def _loader(self, offset: int) -> DataLoader:
        h = self.hparams
        gen = torch.Generator().manual_seed(h.seed + offset)
        ids = torch.randint(h.low, h.high, (h.num_samples, h.seq_len), generator=gen)
        dataset = TensorDataset(ids)
        return DataLoader(dataset, batch_size=h.batch_size, collate_fn=_collate)

    def train_dataloader(self) -> DataLoader:
        return self._loader(0)

    def val_dataloader(self) -> DataLoader:
        return self._loader(1)

    def test_dataloader(self) -> DataLoader:
        return self._loader(2)

    def calibration_dataloader(self) -> DataLoader:
        return self._loader(3)


def _collate(rows):
    ids = torch.stack([r[0] for r in rows])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

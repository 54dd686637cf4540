"""MoECausalLM: a LightningModule around a transformers 5 MoE causal LM or MLLM.

The wrapped model is ``self.model``; lightprune's callbacks read and change it in place. It is
built in ``configure_model`` (so strategies can shard it) from a local checkpoint directory
(``checkpoint``) or from a tiny config of a supported family (``tiny``), never from a hub.
Loss: next-token cross-entropy over positions whose ``labels`` are not -100 (``labels``
default to ``input_ids`` with padding masked). Fine-tuning recipes (adapters, answer-only loss,
metrics) come with the router-sensitivity work; this module is the common shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

__all__ = ["MoECausalLM"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class MoECausalLM(pl.LightningModule):
    """Wrap an MoE language model.

    Args:
        checkpoint: local directory of a transformers checkpoint (or a lightprune export).
        tiny: instead of a checkpoint, build a tiny random model of this family
            (see ``lightprune.models.tiny.TINY_FAMILIES``), seeded by ``seed``.
        tiny_overrides: config overrides for the tiny model (e.g. ``num_hidden_layers``).
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        trust_remote_code: allow a checkpoint's own modeling code to run (off by default).
        learning_rate: AdamW learning rate for ``fit``.
    """

    def __init__(self, checkpoint: str | None = None, tiny: str | None = None, tiny_overrides: dict | None = None,
                 seed: int = 0, dtype: str = "float32", trust_remote_code: bool = False,
                 learning_rate: float = 1e-4):
        super().__init__()
        if (checkpoint is None) == (tiny is None):
            raise ValueError("give exactly one of checkpoint= (a local directory) or tiny= (a family name); "
                             f"got checkpoint={checkpoint!r}, tiny={tiny!r}")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        if checkpoint is not None and not Path(checkpoint).is_dir():
            raise FileNotFoundError(f"checkpoint directory {checkpoint!r} does not exist")
        if tiny is not None:
            from ..models.tiny import TINY_FAMILIES

            if tiny not in TINY_FAMILIES:
                raise ValueError(f"tiny must be one of {list(TINY_FAMILIES)}, got {tiny!r}")
        self.save_hyperparameters()
        self.model: torch.nn.Module | None = None

    @property
    def source(self) -> str:
        """Where the model came from, for reports."""
        return self.hparams.checkpoint or f"tiny:{self.hparams.tiny}"

    def configure_model(self) -> None:
        if self.model is not None:
            return
        dtype = _DTYPES[self.hparams.dtype]
        if self.hparams.tiny is not None:
            from ..models.tiny import tiny_model

            self.model = tiny_model(self.hparams.tiny, seed=self.hparams.seed,
                                    **(self.hparams.tiny_overrides or {})).to(dtype)
        else:
            from ..export import load_pruned

            self.model = load_pruned(self.hparams.checkpoint, dtype=dtype,
                                     trust_remote_code=self.hparams.trust_remote_code)
        # Lightning switches train/eval per loop; start from train mode like any fresh module
        self.model.train(self.training)

    def forward(self, **batch: Any):
        return self.model(**batch)

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        batch = dict(batch)
        labels = batch.pop("labels", None)
        if labels is None:
            labels = batch["input_ids"].masked_fill(batch.get("attention_mask", 1) == 0, -100)
        logits = self.model(**batch).logits[:, :-1].float()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                                 ignore_index=-100)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("val/loss", loss, prog_bar=True)
        return loss

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("test/loss", loss)
        return loss

    def configure_optimizers(self):
        params = [p for p in self.model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=self.hparams.learning_rate)

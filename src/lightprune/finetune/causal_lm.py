"""MoECausalLM: a LightningModule around a transformers 5 MoE causal LM or MLLM.

The wrapped model is ``self.model``; lightprune's callbacks read and change it in place. It is
built in ``configure_model`` (so strategies can shard it) from a local checkpoint directory
(``checkpoint``) or from a tiny config of a supported family (``tiny``), never from a hub.
Loss: next-token cross-entropy over positions whose ``labels`` are not -100 (``labels``
default to ``input_ids`` with padding masked; the JSONL datamodules mask prompt tokens, so the loss is on
completions). Batch keys that describe a sample rather than feed the model (``task_ids``: the task family of each
row, see `lightprune.data.generated.shapes_qa`) stay in the batch for callbacks and are not passed to the model.
Validation logs torchmetrics perplexity (``val/ppl``) and next-token accuracy (``val/acc``) over
the same positions; a calibration (``lightprune calibrate``) computes neither: its batches only feed the observed
pass, the output head skipped.

Fine-tuning (router sensitivity ("Router Sensitivity Under Lightweight Fine-Tuning Identifies Prunable Experts in
Mixture-of-Experts Models", arXiv 2608.07890), section 4): an optional ``adapter``
([`AdapterSpec`][..adapters.AdapterSpec]) is attached in ``configure_model`` after the model is built (and, with
``load_in_4bit``, after its linear layers are quantised to 4 bit: QLoRA); ``self.model`` is then the model to train (a
peft model for LoRA / IA3) and ``self.base_model`` the transformers model under it, whose routers
[`lightprune.find_moe_layers`][lightprune.models.find_moe_layers] walks. The optimizer (AdamW or bitsandbytes AdamW8bit)
and the per-step schedule (cosine or constant, linear warm-up) are `lightprune.finetune.optim`.

Half precision: a dtype conversion of the module (``--trainer.precision bf16-true`` / ``16-true``: Lightning's
precision plugin runs ``module.to(dtype)`` in the strategy's setup; or ``dtype: bfloat16`` for a tiny model) keeps
the buffers transformers keeps in fp32 (rotary ``inv_freq``, sinusoid position tables:
`lightprune.export.verify.fp32_buffer_names`) in fp32 with their values, as ``from_pretrained(dtype=...)``
leaves them, so the model computes what its exported checkpoint will when reloaded (`MoECausalLM._apply`).
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torchmetrics import MeanMetric
from torchmetrics.text import Perplexity

from lightprune.core.batch import head_skipped, model_inputs
from lightprune.core.distributed import outside_zero_init
from lightprune.core.sources import resolve_checkpoint
from lightprune.export import load_pruned
from lightprune.export.load import LOAD_DTYPES
from lightprune.export.verify import keep_fp32_buffers
from lightprune.finetune.adapters import AdapterSpec, apply_adapter
from lightprune.finetune.balance import per_layer_balance_loss
from lightprune.finetune.module_arguments import check_module_arguments
from lightprune.finetune.optim import build_optimizer, build_scheduler
from lightprune.finetune.quantize import quantize_4bit
from lightprune.models import find_moe_layers
from lightprune.models.experts_kernel import runnable_experts
from lightprune.models.unwrap import base_model_of
from lightprune.testing.tiny import tiny_model

__all__ = ["MoECausalLM"]


class MoECausalLM(pl.LightningModule):
    """Wrap an MoE language model.

    Args:
        checkpoint: local directory of a transformers checkpoint (or a lightprune export), or a testbed
            trained here, ``testbed:text-<preset>`` (`lightprune.testbed.text_moe`; trained and cached
            on first use).
        tiny: instead of a checkpoint, build a tiny random model of this family (see
            ``lightprune.testing.tiny.TINY_FAMILIES`` and ``TINY_DENSE_MLLMS``), seeded by ``seed``.
        tiny_overrides: config overrides for the tiny model (e.g. ``num_hidden_layers``); each must be a field of
            the family's config (a mistyped one is refused with the closest field).
        dtype: ``float32``, ``bfloat16``, ``float16`` or ``float64`` (its experts run transformers' ``eager``
            kernel; not with ``load_in_4bit``).
        trust_remote_code: allow a checkpoint's own modeling code to run (off by default).
        learning_rate: peak learning rate for ``fit``.
        adapter: the parameter-efficient adapter to fine-tune with (None: every parameter trains).
        optimizer: ``adamw`` (torch) or ``adamw8bit`` (bitsandbytes, imported only then).
        weight_decay: AdamW weight decay.
        warmup_steps: linear warm-up optimizer steps.
        scheduler: ``cosine`` (to zero over ``trainer.estimated_stepping_batches``) or ``constant``.
        load_in_4bit: quantise the base model's linear layers to 4 bit (QLoRA, bitsandbytes; CPU works).
        loss_mean: how the training loss averages next-token cross-entropy: ``token`` (over every labelled token
            of the batch) or ``row`` (each row's mean, then the mean over rows: a one-word answer weighs as much as
            a long completion). Validation perplexity is always per token.
        router_aux_loss_coef: weight of the load-balancing loss added to the training loss; 0: none.
        aux_loss: which one: ``model`` (``aux_loss`` of transformers' MoE models: Switch Transformers'
            E * sum_e f_e P_e over all layers pooled) or ``per_layer`` (the same loss of each MoE layer on its own,
            averaged: `lightprune.finetune.balance`; softmax routers).
        sequential: keep one decoder layer in memory at a time (``lightprune calibrate`` / ``export`` of a checkpoint
            larger than memory): the model is the checkpoint's meta skeleton
            ([`lightprune.checkpoints.skeleton`][lightprune.checkpoints.skeleton]), every
            forward loads each layer just before it runs and releases it after, weight criteria score one MoE
            block at a time, and ``Export`` prunes the checkpoint shard by shard (``lp.prune_checkpoint``). Needs
            ``checkpoint``; not for ``fit`` (training needs the weights in memory), nor with an adapter, 4-bit
            weights or ``device_map``.
        batches_per_pass: with ``sequential``, ``lightprune calibrate`` collects this many batches and runs them
            through the layers together (each layer is read once per pass; memory holds the pass's activations).
        stream_device: with ``sequential``, where each layer is read to and computed: None (default) the device
            the trainer puts the module on (each rank's own under DDP), or ``cpu`` / ``cuda`` / ``cuda:N``
            (``--model.init_args.stream_device cuda:1``); the batches follow it.
        device_map, max_memory, offload_folder: passed to transformers' ``from_pretrained`` for a ``checkpoint``
            (accelerate's placement and offload). Calibration refuses an offloaded model before any batch
            (its observers read every MoE layer's weights); ``lp.collect_expert_stats(checkpoint_dir, batches)``
            streams one layer at a time instead.
    """

    def __init__(self, checkpoint: str | None = None, tiny: str | None = None, tiny_overrides: dict | None = None,
                 seed: int = 0, dtype: str = "float32", trust_remote_code: bool = False,
                 learning_rate: float = 1e-4, adapter: AdapterSpec | None = None, optimizer: str = "adamw",
                 weight_decay: float = 0.0, warmup_steps: int = 0, scheduler: str = "cosine",
                 load_in_4bit: bool = False, router_aux_loss_coef: float = 0.0, aux_loss: str = "model",
                 loss_mean: str = "token", device_map: str | dict[str, Any] | None = None,
                 max_memory: dict[str, Any] | None = None,
                 offload_folder: str | None = None, sequential: bool = False, batches_per_pass: int = 16,
                 stream_device: str | None = None):
        super().__init__()
        adapter, batches_per_pass = check_module_arguments(
            checkpoint=checkpoint, tiny=tiny, tiny_overrides=tiny_overrides, dtype=dtype, learning_rate=learning_rate,
            adapter=adapter, optimizer=optimizer, weight_decay=weight_decay, warmup_steps=warmup_steps,
            scheduler=scheduler, load_in_4bit=load_in_4bit, router_aux_loss_coef=router_aux_loss_coef,
            aux_loss=aux_loss, loss_mean=loss_mean, device_map=device_map, max_memory=max_memory,
            offload_folder=offload_folder, sequential=sequential, batches_per_pass=batches_per_pass,
            stream_device=stream_device)
        self.batches_per_pass = batches_per_pass
        self.skeleton = None
        self._deferred: list[dict[str, Any]] = []
        self.adapter = adapter
        self.save_hyperparameters()
        self.model: torch.nn.Module | None = None
        self._ids_checked = False
        self.val_ppl = Perplexity(ignore_index=-100)
        self.val_acc = MeanMetric()

    @property
    def base_model(self) -> torch.nn.Module | None:
        """The transformers model without adapter wrappers (adapters stay active in it)."""
        return None if self.model is None else base_model_of(self.model)

    @property
    def source(self) -> str:
        """Where the model came from, for reports."""
        return self.hparams.checkpoint or f"tiny:{self.hparams.tiny}"

    def build_original(self) -> torch.nn.Module:
        """The model as its source defines it (checkpoint or tiny config), full precision, no adapter.

        What a fine-tune-then-prune job prunes when the trained model has 4-bit base weights (QLoRA).
        """
        dtype = LOAD_DTYPES[self.hparams.dtype]
        if self.hparams.tiny is not None:
            model = tiny_model(self.hparams.tiny, seed=self.hparams.seed, **(self.hparams.tiny_overrides or {}))
            model = keep_fp32_buffers(model, lambda: model.to(dtype))  # as from_pretrained(dtype=dtype) leaves them
            runnable_experts(model.modules())  # float64 experts: transformers' eager ones
            return model

        checkpoint = resolve_checkpoint(self.hparams.checkpoint)
        placement = {k: self.hparams.get(k) for k in ("device_map", "max_memory", "offload_folder")
                     if self.hparams.get(k) is not None}
        return load_pruned(checkpoint, dtype=dtype, trust_remote_code=self.hparams.trust_remote_code, **placement)

    def _apply(self, fn: Any, recurse: bool = True) -> MoECausalLM:
        """``nn.Module._apply`` (``to``, ``half``, ``bfloat16``; Lightning's precision plugin ``convert_module``),
        then the buffers transformers keeps in fp32 that it converted are put back in fp32
        (`keep_fp32_buffers`), and experts that transformers' ``grouped_mm`` cannot
        run in the new dtype (``64-true``) run its ``eager`` ones
        (`runnable_experts`)."""
        apply = super()._apply
        result = keep_fp32_buffers(self, lambda: apply(fn, recurse))
        runnable_experts(self.modules())
        return result

    def configure_model(self) -> None:
        if self.model is not None:
            return
        if self.hparams.get("sequential"):
            from lightprune.checkpoints import Checkpoint, Skeleton

            strategy = getattr(self._trainer, "strategy", None) if self._trainer is not None else None
            if strategy is not None and "deepspeed" in type(strategy).__name__.lower():
                raise ValueError("sequential=True keeps one decoder layer in memory per process; DeepSpeed shards a "
                                 "model held in memory: run it in one process or under DDP "
                                 "(--trainer.strategy ddp), or drop sequential")
            device = self.hparams.get("stream_device") or \
                (strategy.root_device if strategy is not None else "cpu")  # the trainer's, as the batches'
            self.skeleton = Skeleton(Checkpoint(resolve_checkpoint(self.hparams.checkpoint)),
                                     dtype=LOAD_DTYPES[self.hparams.dtype], device=device)
            # not a submodule: its tensors stay on the meta device and only the skeleton moves them, one layer at a
            # time (Lightning's .to(device), optimizers and state dicts never see them)
            self.__dict__["model"] = self.skeleton.model
            return

        # inside Lightning's ZeRO-3 zero.Init the tiny model's seeded re-draws and peft's LoRA init (B = 0)
        # would write into empty partitions: build with full parameters, DeepSpeed partitions them later
        with outside_zero_init():
            self.model = self.build_original()
            if self.hparams.load_in_4bit:
                self.model = quantize_4bit(self.model, compute_dtype=LOAD_DTYPES[self.hparams.dtype])
            if self.adapter is not None:
                self.model = apply_adapter(self.model, self.adapter)
        # Lightning switches train/eval per loop; start from train mode like any fresh module
        self.model.train(self.training)

    def forward(self, **batch: Any):
        if not self._ids_checked:
            self._check_token_ids(batch)
        if self.skeleton is not None:
            from lightprune.checkpoints.sequential import layer_by_layer

            with layer_by_layer(self.skeleton):
                return self.model(**model_inputs(batch, keep_labels=True, device=self.skeleton.device))
        return self.model(**model_inputs(batch, keep_labels=True))

    def _check_token_ids(self, batch: dict[str, Any]) -> None:
        """Once per module: the data's token ids must fit the model's embedding (a tokenizer with a larger
        vocabulary than the model's would fail deep inside the embedding lookup)."""
        ids = batch.get("input_ids")
        embedding = self.base_model.get_input_embeddings() if hasattr(self.base_model, "get_input_embeddings") else None
        rows = getattr(embedding, "num_embeddings", None)
        if isinstance(ids, torch.Tensor) and ids.numel() and rows is not None:
            top = int(ids.max())
            if top >= rows or int(ids.min()) < 0:
                raise ValueError(f"the data has token id {top if top >= rows else int(ids.min())}, but the model's "
                                 f"embedding has {rows} rows (ids 0..{rows - 1}): the tokenizer does not belong to "
                                 f"this model (its vocabulary is larger); use the checkpoint's own tokenizer")
        self._ids_checked = True

    def _shifted(self, batch: dict[str, torch.Tensor], aux: bool = False):
        """(logits [B, T-1, V] fp32, next-token labels [B, T-1] with -100 where no loss is taken); with ``aux``,
        also the model's load-balancing loss."""
        batch = dict(batch)
        labels = batch.pop("labels", None)
        if labels is None:
            labels = batch["input_ids"].masked_fill(batch.get("attention_mask", 1) == 0, -100)
        out = self(**batch, output_router_logits=True) if aux else self(**batch)
        logits = out.logits[:, :-1].float()
        if not aux:
            return logits, labels[:, 1:]
        if self.hparams.get("aux_loss", "model") == "per_layer":
            return logits, labels[:, 1:], per_layer_balance_loss(out.router_logits, self._top_k(),
                                                                 batch.get("attention_mask"))
        if getattr(out, "aux_loss", None) is None:
            raise ValueError(f"router_aux_loss_coef={self.hparams.router_aux_loss_coef} but "
                             f"{type(self.base_model).__name__} returns no aux_loss (a dense model?)")
        return logits, labels[:, 1:], out.aux_loss

    def _top_k(self) -> int:
        """The MoE layers' top-k (found once: the per-layer balance loss asks every training step)."""
        if getattr(self, "_moe_top_k", None) is None:
            top_ks = {layer.top_k for layer in find_moe_layers(self.base_model)}
            if len(top_ks) != 1:
                raise ValueError(f"aux_loss='per_layer' needs one top-k in every MoE layer, got {sorted(top_ks)}")
            self._moe_top_k = top_ks.pop()
        return self._moe_top_k

    @staticmethod
    def _ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                 ignore_index=-100)

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._ce(*self._shifted(batch))

    def _train_ce(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The training cross-entropy, averaged as ``loss_mean`` says."""
        if self.hparams.get("loss_mean", "token") == "token":
            return self._ce(logits, labels)
        per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                      ignore_index=-100, reduction="none").view(labels.shape)
        counts = (labels != -100).sum(-1)
        rows = counts > 0
        return (per_token.sum(-1)[rows] / counts[rows]).mean()

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        coef = self.hparams.get("router_aux_loss_coef", 0.0)
        if not coef:
            loss = self._train_ce(*self._shifted(batch))
            self.log("train/loss", loss, prog_bar=True)
            return loss
        logits, labels, aux = self._shifted(batch, aux=True)
        ce = self._train_ce(logits, labels)
        self.log("train/loss", ce, prog_bar=True)
        self.log("train/aux_loss", aux)
        return ce + coef * aux

    def on_validation_epoch_start(self) -> None:
        # a loop run under inference mode (calibrate, validate) may have reset the metric states to inference
        # tensors, which a later no-grad loop (fit's validation) could not update in place: start from fresh ones
        with torch.inference_mode(False):
            self.val_ppl.reset()
            self.val_acc.reset()

    # ------------------------------------------------------------------ sequential calibration
    def defers_forwards(self) -> bool:
        """True while a calibration of a ``sequential`` model runs: ``validation_step`` only collects the batches,
        and `flush_deferred` runs them through the layers one pass at a time."""
        trainer = self._trainer
        return self.skeleton is not None and trainer is not None and bool(getattr(trainer, "calibrating", False))

    def leaves_calibration_forwards(self) -> bool:
        """True while a calibration of a model in memory runs: ``validation_step`` does nothing, and the ExpertStats
        callback feeds each batch to its observer as ``lp.collect_expert_stats`` does
        (`lightprune.experts.calibration.feed.observe_batch`: no loss, the output head skipped)."""
        trainer = self._trainer
        return self.skeleton is None and trainer is not None and bool(getattr(trainer, "calibrating", False))

    def deferred_full(self) -> bool:
        return len(self._deferred) >= self.batches_per_pass

    def flush_deferred(self, before: Any = None) -> None:
        """Run the collected batches' forwards, each decoder layer read once for all of them
        ([`lightprune.checkpoints.sequential.run_layer_outer`][lightprune.checkpoints.sequential.run_layer_outer]);
        ``before(batch)`` runs before a batch enters each layer (the
        calibration observer declares the batch: its token subsets)."""
        from lightprune.checkpoints.sequential import run_layer_outer

        batches, self._deferred = self._deferred, []
        if batches:
            head = head_skipped(self.model)  # as the Python API's streamed pass: no logits are needed
            run_layer_outer(self.skeleton, batches, lambda batch: self.model(**batch, **head),
                            before=None if before is None else lambda i, layer: before(batches[i]))

    def on_validation_epoch_end(self) -> None:
        self.flush_deferred()  # left over without an observer (ExpertStats flushes its own first)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor | None:
        if self.defers_forwards():
            if not self._ids_checked:
                self._check_token_ids(batch)
            self._deferred.append(model_inputs(batch, device=self.skeleton.device))
            return None
        if self.leaves_calibration_forwards():
            return None
        logits, labels = self._shifted(batch)
        loss = self._ce(logits, labels)
        keep = labels != -100
        count = int(keep.sum())  # the step's one host sync
        if count > 0:
            # weighted by label tokens: the epoch's val/loss is the mean over tokens (log of val/ppl, and Evaluate's)
            self.log("val/loss", loss, prog_bar=True, batch_size=count)
            self.val_ppl.update(logits, labels)
            correct = (logits.argmax(-1) == labels) & keep
            self.val_acc.update(correct.sum() / count, weight=count)
            self.log("val/ppl", self.val_ppl, on_step=False, on_epoch=True)
            self.log("val/acc", self.val_acc, on_step=False, on_epoch=True)
        return loss

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits, labels = self._shifted(batch)
        loss = self._ce(logits, labels)
        # the mean over the split's label tokens, as Evaluate's loss (a mean of batch means would differ)
        self.log("test/loss", loss, batch_size=max(1, int((labels != -100).sum())))
        return loss

    def configure_optimizers(self):
        hp = self.hparams
        if self.skeleton is not None:
            raise ValueError("sequential=True keeps one decoder layer in memory: it calibrates and exports, it does "
                             "not train (fine-tuning needs the model in memory; drop --model.init_args.sequential)")
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = build_optimizer(params, hp.optimizer, hp.learning_rate, hp.weight_decay)
        if hp.scheduler == "constant" and hp.warmup_steps == 0:
            return optimizer
        total = self.trainer.estimated_stepping_batches if self._trainer is not None else float("inf")
        if hp.scheduler == "cosine" and not math.isfinite(total):
            rank_zero_warn("scheduler='cosine' needs a known number of steps (set trainer max_steps); "
                           "the learning rate stays constant after warm-up")
        scheduler = build_scheduler(optimizer, hp.scheduler, hp.warmup_steps, total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

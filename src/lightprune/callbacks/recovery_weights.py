"""The weights a width search recovers (MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient
MLLMs"), Alg. 1): each candidate starts from M0's trainable weights (`load_trainable` of the snapshot
`trainable` took), with a fresh optimizer state and the learning-rate schedule restarted over its own steps
(`restart_optimization`); its recovered weights are saved (`save_trainable`, at
`candidate_weights_path`) and read back when it is chosen. Used by
[`WidthSearch`][..width_search.WidthSearch].
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import torch

from lightprune.core.paths import through_file, write_atomically
from lightprune.finetune.optim import build_scheduler
from lightprune.width.search import Candidate

__all__ = ["candidate_weights_path", "load_trainable", "restart_optimization", "save_trainable", "trainable"]


def trainable(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """``model``'s parameters that train (the adapter's and the projector's), by name."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def load_trainable(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Copy ``weights`` (a snapshot of `trainable`) into ``model``'s trainable parameters; a RuntimeError when
    the two name other parameters."""
    params = trainable(model)
    if set(params) != set(weights):
        raise RuntimeError("the model's trainable parameters differ from the search's snapshot: "
                           f"{sorted(set(params) ^ set(weights))[:5]}")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(weights[name].to(param.device, param.dtype))


def restart_optimization(trainer: pl.Trainer, pl_module: pl.LightningModule, recovery_epochs: int) -> None:
    """A new candidate's optimisation: every optimizer's state cleared and its learning rate back at the initial
    one, the schedule (MoECausalLM's ``scheduler`` and ``warmup_steps``) rebuilt over ``recovery_epochs`` epochs."""
    accumulate = max(1, trainer.accumulate_grad_batches)
    steps = -(-trainer.num_training_batches // accumulate) * recovery_epochs
    for optimizer in trainer.optimizers:
        optimizer.state.clear()
        for group in optimizer.param_groups:
            group["lr"] = group.get("initial_lr", group["lr"])
    hp = pl_module.hparams
    for config in trainer.lr_scheduler_configs:
        config.scheduler = build_scheduler(config.scheduler.optimizer, hp.scheduler, hp.warmup_steps, steps)


def candidate_weights_path(run_dir: Path, candidate: Candidate) -> Path:
    """Where ``candidate``'s recovered trainable weights go under the search's ``run_dir``."""
    return run_dir / "candidates" / f"{candidate.label().replace('@', '_')}.pt"


def save_trainable(trainer: pl.Trainer, model: torch.nn.Module, path: Path) -> str:
    """Write ``model``'s trainable weights to ``path`` (rank zero, atomically; every rank waits for it); its name."""
    if trainer.is_global_zero:
        weights = {n: p.detach().cpu() for n, p in trainable(model).items()}
        write_atomically(path, through_file(lambda handle: torch.save(weights, handle)),
                         "WidthSearch candidate weights")
    trainer.strategy.barrier()
    return str(path)

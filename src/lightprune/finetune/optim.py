"""Optimizers and learning-rate schedules for adapter fine-tuning (router sensitivity ("Router Sensitivity Under
Lightweight Fine-Tuning Identifies Prunable Experts in Mixture-of-Experts Models", arXiv 2608.07890), section 4
and Table 10).

The reference recipe is 8-bit AdamW (bitsandbytes), lr 2e-4, weight decay 0.01, a cosine schedule with 5
linear warm-up steps. ``adamw`` is torch's AdamW; ``adamw8bit`` is ``bitsandbytes.optim.AdamW8bit``,
imported only when asked for. bitsandbytes keeps 32-bit state for tensors smaller than its
``min_8bit_size`` (4096 elements), so a tiny router LoRA trains with 32-bit moments either way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from lightprune.core.extras import require

__all__ = ["OPTIMIZERS", "SCHEDULERS", "build_optimizer", "build_scheduler", "lr_factor"]

OPTIMIZERS = ("adamw", "adamw8bit")
SCHEDULERS = ("cosine", "constant")


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


def build_optimizer(params: Iterable[torch.nn.Parameter], name: str = "adamw", lr: float = 1e-4,
                    weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """AdamW (torch) or AdamW8bit (bitsandbytes) over ``params``."""
    check_choice("optimizer", name, OPTIMIZERS)
    params = list(params)
    if not params:
        raise ValueError("no trainable parameters: nothing to optimize (is every parameter frozen?)")
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    bnb = require("qlora", "optimizer='adamw8bit' (or optimizer='adamw' without it)")
    return bnb.optim.AdamW8bit(params, lr=lr, weight_decay=weight_decay)


def lr_factor(step: int, schedule: str, warmup_steps: int, total_steps: int | float) -> float:
    """Multiplier of the base lr at optimizer step ``step`` (0-based).

    Linear warm-up from ``1 / (warmup_steps + 1)`` ... to 1 over ``warmup_steps`` steps, then constant or a
    half-cosine from 1 to 0 over the remaining ``total_steps - warmup_steps`` steps (transformers'
    ``get_cosine_schedule_with_warmup`` shape, without its zero first step).
    """
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant" or not math.isfinite(total_steps):
        return 1.0
    decay = max(1.0, float(total_steps) - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, schedule: str = "cosine", warmup_steps: int = 0,
                    total_steps: int | float = math.inf) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-step ``LambdaLR`` following `lr_factor`; an unknown total (inf) gives constant after warm-up."""
    check_choice("scheduler", schedule, SCHEDULERS)
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, schedule, warmup_steps, total_steps))

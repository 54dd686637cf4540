"""What every testbed shares: its cache folder, an isolated random state, and the fit from an initial checkpoint.

A testbed folder ``<root>/testbed/<name>-<digest of its spec>/`` holds ``model/`` (a checkpoint every
lightprune command loads), ``training.json`` and a manifest each; `cached_testbed` returns it when
both manifests check, else trains it into a temporary folder renamed into place (the default corpus's
cache helpers), with the job's random state left untouched (`isolated_rng`). `fit_from_init`
is the training itself: `MoECausalLM` from the initial checkpoint, AdamW with
linear warm-up and cosine decay for a fixed number of steps (not a time budget), on the caller's torch threads
(`training_threads`) with torch's deterministic algorithms (`deterministic_training`), so a rerun gives
the same weights on the same CPU, thread count, torch and Python (`training_facts`: in the manifest and the
cache key), the loss curve kept by `LossCurve`. What the testbeds
report about themselves and the quality tables measure on them: `next_token_metrics` over batches of
`encode_batches`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightprune.core import interrupt, notices
from lightprune.core.batch import model_inputs
from lightprune.data.cache import CacheError, build_folder, check_folder
from lightprune.finetune import MoECausalLM

__all__ = ["LossCurve", "WindowRate", "cache_root", "cached_testbed", "deterministic_training", "encode_batches",
           "facts_digest", "fit_from_init", "isolated_rng", "next_token_metrics", "next_token_row_sums", "spec_digest",
           "training_facts", "training_threads", "windowed_bar"]

#: Lightning's info logger (its device banner, its "`Trainer.fit` stopped" line)
_RANK_ZERO = "lightning.pytorch.utilities.rank_zero"

_MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def cache_root(root: str | os.PathLike | None) -> Path:
    """``root``, else ``$LIGHTPRUNE_CACHE``, else ``~/.cache/lightprune``."""
    return Path(root or os.environ.get("LIGHTPRUNE_CACHE") or Path.home() / ".cache" / "lightprune").expanduser()


def spec_digest(fmt: str, spec, omit_none: Sequence[str] = ()) -> str:
    """12 hex digits of SHA-256 over the format and every field of the (dataclass) ``spec``: the cache key.
    ``omit_none``: fields left out while None (added after testbeds were cached, which keep their digest)."""
    key = {"format": fmt, **{k: v for k, v in asdict(spec).items() if not (k in omit_none and v is None)}}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def _cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's processor or machine string."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def training_threads() -> int:
    """The CPU threads a testbed trains with: torch's count in the calling thread (``OMP_NUM_THREADS``, else the
    machine's cores, unless the caller set another). The weights depend on it (torch's CPU kernels split their
    reductions by thread: the small text testbed's loss at step 48 is 6.081 on 2 threads, 6.146 on 1), so it is
    one of the `training_facts`: another count trains, and caches, another testbed."""
    import torch

    return torch.get_num_threads()


def training_facts() -> dict[str, Any]:
    """What besides its spec decides a testbed's trained weights: the training threads (`training_threads`),
    the CPU (its vector width orders the reductions), torch and Python (the text corpus is Python's own
    documentation). Recorded in each testbed's manifest and part of its cache key (`facts_digest`)."""
    import platform

    import torch

    return {"threads": training_threads(), "cpu": _cpu_model(), "torch": torch.__version__,
            "python": platform.python_version(), "deterministic_algorithms": True}


def facts_digest() -> str:
    """8 hex digits of SHA-256 over `training_facts`: the second half of a testbed folder's name."""
    return hashlib.sha256(json.dumps(training_facts(), sort_keys=True).encode()).hexdigest()[:8]


@contextmanager
def deterministic_training(threads: int | None = None) -> Iterator[None]:
    """Inside the block torch runs on ``threads`` CPU threads (default: `training_threads`) with its
    deterministic algorithms (a warning where an op has none); both are restored on exit."""
    import torch

    threads = training_threads() if threads is None else threads

    previous = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled())
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.set_num_threads(previous[0])
        torch.use_deterministic_algorithms(previous[1], warn_only=previous[2])


@contextmanager
def isolated_rng() -> Iterator[None]:
    """Run a training inside a job without moving the job's random state (torch, random, numpy, Lightning's seed).

    A job that trains its testbed on first use must draw the same adapter initialisation as a job that
    finds the testbed cached.
    """
    import random

    import numpy as np
    import torch

    states = (random.getstate(), np.random.get_state(), torch.random.get_rng_state())
    env = {k: os.environ.get(k) for k in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")}
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def cached_testbed(folder: Path, expect: dict[str, Any], train: Callable[[Path], None]) -> Path:
    """``folder`` when its manifests (and ``model/``'s) match ``expect``; else ``train(tmp_folder)`` first."""
    try:
        check_folder(folder, expect, ("training.json",))
        check_folder(folder / "model", expect, _MODEL_FILES)
    except CacheError as e:
        if folder.exists():
            from lightning.pytorch.utilities.rank_zero import rank_zero_warn

            rank_zero_warn(f"retraining the testbed {folder}: {e}")
        with isolated_rng(), interrupt.doing(f"training the embedded testbed {folder.name} (nothing of it is "
                                             "cached until it finishes)"):
            rank_zero_info(f"lightprune: training the embedded testbed {folder.name} once, on "
                           f"{_threads_said(expect)}; it is cached under {folder.parent} and later runs reuse it")
            busy = _busy(expect)
            if busy:
                rank_zero_info(busy)
            build_folder(folder, train, replace=folder.exists())
    return folder


def _threads_said(expect: dict[str, Any]) -> str:
    """``"2 threads (torch's count: ...)"``: the count the testbed trains with and how to change it."""
    threads = expect.get("facts", {}).get("threads", training_threads())
    return (f"{threads} thread{'s' if threads != 1 else ''} (torch's count, which OMP_NUM_THREADS sets; the weights "
            "depend on it, so another count trains and caches another testbed)")


def _busy(expect: dict[str, Any]) -> str | None:
    """A line for a machine whose other work already fills its cores (1-minute load average at least the core
    count) while the testbed trains on several threads: threads waiting on each other at every kernel's barrier run
    many times slower there; one thread does not wait."""
    threads = expect.get("facts", {}).get("threads", training_threads())
    try:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
    except OSError:  # no load average on this platform
        return None
    if threads < 2 or load < cores:
        return None
    return (f"lightprune: this machine is busy (load {load:.1f} on {cores} cores): {threads} threads wait on each "
            "other there and can train many times slower; OMP_NUM_THREADS=1 trains on one")


class WindowRate:
    """Steps per second over the last ``seconds`` of a run (and at least its last ``min_points`` updates): the rate
    a bar's time left is computed from. tqdm's default (an exponential average of each update's steps and seconds,
    weight 0.3) moves the estimate several-fold when one step stalls on a busy machine; a window of a minute does
    not."""

    def __init__(self, seconds: float = 60.0, min_points: int = 10):
        self.seconds, self.min_points = seconds, min_points
        self.points: deque[tuple[float, float]] = deque()

    def add(self, time: float, count: float) -> None:
        """The run had done ``count`` steps at ``time``."""
        self.points.append((time, count))
        while len(self.points) > self.min_points and self.points[1][0] <= time - self.seconds:
            self.points.popleft()

    def rate(self) -> float | None:
        """(steps done from the window's first point to its last) / (seconds between them); None before two
        points or when no time has passed."""
        if len(self.points) < 2:
            return None
        (t0, n0), (t1, n1) = self.points[0], self.points[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 and n1 > n0 else None


def windowed_bar(**kwargs: Any):
    """A tqdm bar (``tqdm.auto``'s kind) whose rate and time left come from a `WindowRate` of its updates."""
    from tqdm.auto import tqdm

    class WindowedBar(tqdm):
        def __init__(self, **options: Any):
            self.window = WindowRate()
            super().__init__(**options)
            self.window.add(self._time(), self.n)

        def update(self, n: float | None = 1) -> bool | None:
            self.window.add(self._time(), self.n + (n or 0))
            return super().update(n)

        @property
        def format_dict(self) -> dict[str, Any]:
            found = super().format_dict
            rate = self.window.rate()
            if rate is not None:
                found["rate"] = rate
            return found

    return WindowedBar(**kwargs)


class StepsBar(pl.Callback):
    """A bar over the whole training (``max_steps`` optimizer steps, its rate and time left for all of them, over
    the last minute: `WindowRate`), where Lightning's bar counts the batches of one epoch; the running loss
    beside it."""

    def __init__(self, description: str):
        self.description = description
        self.bar = None

    def on_train_start(self, trainer, module):
        self.bar = windowed_bar(total=trainer.max_steps, desc=self.description, unit="step", leave=False,
                                initial=trainer.global_step)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.bar is None:
            return
        self.bar.update(trainer.global_step - self.bar.n)
        loss = trainer.callback_metrics.get("train/loss")
        if loss is not None:
            self.bar.set_postfix(loss=f"{float(loss):.3f}", refresh=False)

    def on_train_end(self, trainer, module):
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def on_exception(self, trainer, module, exception):
        self.on_train_end(trainer, module)


class LossCurve(pl.Callback):
    """Keeps (step, train loss, aux loss) every ``every`` optimizer steps and at the last (and logs them when
    ``log``: no bar is shown). The flag is kept as ``log_points``: a trainer sets every callback's ``log`` to its
    module's ``log`` method (a bound method, always true) when it attaches the module."""

    def __init__(self, every: int, log: bool = False):
        self.every, self.log_points = every, log
        self.points: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step % self.every == 0 or step == trainer.max_steps:
            m = trainer.callback_metrics
            self.points.append({"step": step, "loss": float(m["train/loss"]),
                                "aux_loss": float(m.get("train/aux_loss", math.nan))})
            if self.log_points:  # no bar: a line per point, for logs of background runs
                rank_zero_info(f"step {step}/{trainer.max_steps}: loss {self.points[-1]['loss']:.4f}")


def fit_from_init(folder: Path, init: Path, datamodule, spec, *, router_aux_loss_coef: float,
                  progress: bool) -> tuple[Any, float, list[dict[str, float]]]:
    """Train the checkpoint ``init`` on ``datamodule`` as ``spec`` says (steps, learning_rate, weight_decay,
    warmup_steps, seed, and ``loss_mean``, ``aux_loss`` and ``max_grad_norm`` when it has them); returns (the trained
    transformers model, seconds, loss curve). ``init`` is removed."""
    pl.seed_everything(spec.seed, verbose=False)
    module = MoECausalLM(checkpoint=str(init), learning_rate=spec.learning_rate, weight_decay=spec.weight_decay,
                         warmup_steps=spec.warmup_steps, scheduler="cosine", router_aux_loss_coef=router_aux_loss_coef,
                         aux_loss=getattr(spec, "aux_loss", "model"), loss_mean=getattr(spec, "loss_mean", "token"))
    curve = LossCurve(max(1, spec.steps // 50), log=not progress)
    with notices.dropped(_RANK_ZERO, "GPU available", "TPU available"):  # the job's own trainer said it already
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=spec.steps, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             limit_val_batches=0, num_sanity_val_steps=0,
                             gradient_clip_val=getattr(spec, "max_grad_norm", None),
                             callbacks=[curve, *([StepsBar("training the testbed")] if progress else [])],
                             default_root_dir=str(folder / "lightning"))
    start = time.perf_counter()
    with deterministic_training(), notices.dropped(_RANK_ZERO, "`Trainer.fit` stopped"):
        trainer.fit(module, datamodule=datamodule)
    seconds = time.perf_counter() - start
    shutil.rmtree(init)
    shutil.rmtree(folder / "lightning", ignore_errors=True)
    return module.model, seconds, curve.points


def encode_batches(datamodule, rows: Sequence[Any], max_batches: int | None = None) -> list[dict[str, Any]]:
    """Rows (`Row`) in file order as the datamodule's padded batches (the first
    ``max_batches``)."""
    collate = datamodule._collator()
    size = datamodule.batch_size
    starts = range(0, len(rows), size)
    if max_batches is not None:
        starts = starts[:max_batches]
    return [collate(datamodule.encode_rows(list(rows[i:i + size]))) for i in starts]


def next_token_row_sums(model, batches: Sequence[dict[str, Any]]):
    """Per row of ``batches`` (in order): (negative log-likelihood sum, right next-token argmaxes, labelled
    positions), float64 tensors [rows]."""
    import torch

    nll, right, count = [], [], []
    model.eval()
    with torch.no_grad():
        for batch in batches:
            logits = model(**model_inputs(batch)).logits[:, :-1].float()
            labels = batch["labels"][:, 1:]
            keep = labels != -100
            token_nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels.clamp_min(0),
                                                          reduction="none")
            nll.append((token_nll.double() * keep).sum(dim=1))
            right.append(((logits.argmax(-1) == labels) & keep).sum(dim=1).double())
            count.append(keep.sum(dim=1).double())
    if not count or float(torch.cat(count).sum()) == 0:
        raise ValueError("no labelled positions to evaluate")
    return torch.cat(nll), torch.cat(right), torch.cat(count)


def next_token_metrics(model, batches: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """(perplexity, next-token accuracy) over the labelled positions of ``batches``."""
    nll, right, count = next_token_row_sums(model, batches)
    return math.exp(float(nll.sum() / count.sum())), float(right.sum() / count.sum())

"""Quiet runs: the command drops exactly the third-party notices lightprune.cli.quiet names, and --verbose keeps them."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

import pytest
from fixtures import REPO

from lightprune.cli import quiet
from lightprune.core import notices


def test_verbose_is_an_argument_or_the_environment() -> None:
    assert quiet.is_verbose(["lightprune", "fit", "--verbose"], environ={})
    assert quiet.is_verbose(["lightprune", "fit"], environ={quiet.VERBOSE_ENV: "1"})
    assert not quiet.is_verbose(["lightprune", "fit"], environ={quiet.VERBOSE_ENV: "0"})
    assert not quiet.is_verbose(["lightprune", "fit", "--verbose_not"], environ={})


def test_install_drops_the_named_notices_and_nothing_else() -> None:
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Keep()
    loggers = [logging.getLogger(name) for name in quiet.DROPPED_LOGS]
    before = {id(l): (list(l.filters), l.level, l.propagate) for l in loggers}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            quiet.install()
            quiet.install()  # idempotent: one filter per logger
            for logger in loggers:
                logger.addHandler(handler)
                logger.setLevel(logging.INFO)
                logger.propagate = False
            for name, fragments in quiet.DROPPED_LOGS.items():
                logging.getLogger(name).warning("notice: %s (details)", fragments[0])
                logging.getLogger(name).warning("a real warning from %s", name)
            warnings.warn("`is_gradient_checkpointing` is deprecated and will be removed", FutureWarning)
            warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", DeprecationWarning)
            warnings.warn("something else is deprecated", FutureWarning)
        assert sum(len([f for f in l.filters if isinstance(f, notices._Drop)]) for l in loggers) == len(loggers)
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
            filters, level, propagate = before[id(logger)]
            logger.filters[:] = filters
            logger.setLevel(level)
            logger.propagate = propagate
    assert seen == [f"a real warning from {name}" for name in quiet.DROPPED_LOGS]
    assert [str(w.message) for w in caught] == ["something else is deprecated"]


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
@pytest.mark.exhaustive
def test_the_command_is_quiet_unless_verbose(tmp_path, testbed_root, verbose) -> None:
    """The README's default job on the micro testbed, in a fresh process: Lightning's litlogger tip and
    bitsandbytes' optional-kernel notice are gone, and --verbose brings them back."""
    args = [sys.executable, "-m", "lightprune.cli.app", "calibrate", "--config", "configs/quickstart.yaml",
            "--model.init_args.checkpoint", "testbed:text-micro", "--data.init_args.preset", "micro",
            "--evaluate.data.init_args.preset", "micro", "--evaluate.max_batches", "1", "--evaluate.progress", "false",
            "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path / "run")]
    env = {**os.environ, "LIGHTPRUNE_CACHE": str(testbed_root), "HF_HUB_OFFLINE": "1"}
    env.pop(quiet.VERBOSE_ENV, None)
    for name in quiet.QUIET_ENV:
        env.pop(name, None)
    done = subprocess.run(args + (["--verbose"] if verbose else []), cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    output = done.stdout + done.stderr
    assert ("litlogger" in output) == verbose
    assert ("Loading weights" in output) == verbose  # the export's reload
    if not verbose:  # (shown verbose only where bitsandbytes lacks its optional kernel package)
        assert "gemm_4bit_forward" not in output and "is_gradient_checkpointing" not in output
    assert "ExpertPruning: reap selects" in output  # lightprune's own lines stay


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
@pytest.mark.exhaustive
def test_the_python_api_is_as_quiet_as_the_command(tmp_path, verbose) -> None:
    """An export from Python in a fresh process (the dev extras installed: DeepSpeed is imported on the way): no
    DeepSpeed notice, no progress bars of the export's own save and reload; LIGHTPRUNE_VERBOSE=1 shows them."""
    script = ("import lightprune as lp\n"
              "from lightprune.testing.tiny import tiny_model\n"
              "model = tiny_model('qwen3_moe')\n"
              "plan = lp.select_experts(lp.score_weights(model, 'aimer'), ratio=0.5)\n"
              f"lp.export_pruned(model, plan, {str(tmp_path / 'out')!r})\n"
              "print('exported')\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop(quiet.VERBOSE_ENV, None)
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    if verbose:
        env[quiet.VERBOSE_ENV] = "1"
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0 and done.stdout.endswith("exported\n"), done.stderr[-2000:]
    assert ("Loading weights" in done.stderr) == verbose and ("Writing model shards" in done.stderr) == verbose
    assert ("Setting accelerator to CPU" in done.stdout + done.stderr) == verbose  # DeepSpeed prints to stdout
    if not verbose:
        assert done.stdout == "exported\n" and done.stderr == "", done.stdout + done.stderr


def test_the_progress_bar_says_calibration_while_calibrating(tmp_path) -> None:
    """PruneTrainer's default bar labels a calibration pass "Calibration" and a validation pass "Validation"; a bar
    the user passes is left as it is."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import TQDMProgressBar

    from lightprune.cli.trainer import PruneTrainer

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def validation_step(self, batch, batch_idx):
            return self.layer(batch).sum()

    labels: list[str] = []

    class Record(pl.Callback):
        def on_validation_batch_start(self, trainer, *args):
            labels.append(trainer.progress_bar_callback.validation_description)

    data = torch.utils.data.DataLoader(torch.zeros(2, 2), batch_size=1)
    trainer = PruneTrainer(callbacks=[Record()], logger=False, default_root_dir=tmp_path, accelerator="cpu")
    trainer.calibrate(Tiny(), dataloaders=data)
    trainer.validate(Tiny(), dataloaders=data, verbose=False)
    assert labels == ["Calibration", "Calibration", "Validation", "Validation"]
    mine = TQDMProgressBar()
    assert PruneTrainer(callbacks=[mine], logger=False, default_root_dir=tmp_path).progress_bar_callback is mine
    quiet_trainer = PruneTrainer(logger=False, enable_progress_bar=False, default_root_dir=tmp_path)
    assert quiet_trainer.progress_bar_callback is None


def test_a_run_bounded_by_steps_shows_the_epoch_without_a_negative_bound(tmp_path) -> None:
    """Rich's bar writes "Epoch N/<max_epochs - 1>", which is "/-2" when only max_steps bounds the run."""
    from lightning.pytorch.callbacks.progress.rich_progress import _RICH_AVAILABLE

    from lightprune.cli.trainer import PruneTrainer
    from lightprune.finetune.progress import progress_bar

    if not _RICH_AVAILABLE:
        pytest.skip("the tqdm bar writes no epoch bound")
    # a fit bounded by max_steps alone runs with max_epochs = -1 (Lightning sets it when the fit starts)
    for kwargs, expected in (({"max_steps": 4, "max_epochs": -1}, "Epoch 3"), ({"max_epochs": 5}, "Epoch 3/4")):
        bar = progress_bar()
        trainer = PruneTrainer(callbacks=[bar], logger=False, default_root_dir=tmp_path, **kwargs)
        bar.setup(trainer, None, "fit")  # what the fit loop's setup does
        assert bar._get_train_description(3).strip() == expected


def test_dropped_hides_a_logger_s_named_lines_inside_the_block_only(monkeypatch) -> None:
    """The testbed's inner trainer: Lightning's banner dropped inside the block, every other line kept, nothing
    dropped after it or when verbose."""
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logger = logging.getLogger("lightprune.test.dropped")
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    logger.propagate = False
    monkeypatch.delenv(quiet.VERBOSE_ENV, raising=False)
    with notices.dropped("lightprune.test.dropped", "GPU available", "TPU available"):
        logger.info("GPU available: False, used: False")
        logger.info("training the testbed")
    logger.info("GPU available: after the block")
    monkeypatch.setenv(quiet.VERBOSE_ENV, "1")
    with notices.dropped("lightprune.test.dropped", "GPU available"):
        logger.info("GPU available: verbose")
    assert seen == ["training the testbed", "GPU available: after the block", "GPU available: verbose"]

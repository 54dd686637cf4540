"""2-process DDP (ddp_fork, gloo) calibration equals one process over the union of the data."""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

import lightprune as lp
from lightprune.callbacks import ExpertPruning, ExpertStats
from lightprune.cli.trainer import PruneTrainer
from lightprune.data import SyntheticTokens
from lightprune.finetune import MoECausalLM
from lightprune.testing.tiny import tiny_model

pytestmark = pytest.mark.exhaustive  # the exhaustive tier only: two processes per test


DATA = {"num_samples": 8, "seq_len": 10, "batch_size": 2, "seed": 7}


class _PlanPerRank(pl.Callback):
    """Every rank writes the plan it computed, so the test can compare them."""

    def __init__(self, out: Path):
        self.out = out

    def on_calibrate_end(self, trainer, pl_module):
        plan = next(cb for cb in trainer.callbacks if isinstance(cb, ExpertPruning)).plan
        plan.save(self.out / f"plan.rank{trainer.global_rank}.json")


@pytest.mark.distributed
def test_two_rank_calibration_equals_one_process(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    trainer = PruneTrainer(accelerator="cpu", devices=2, strategy="ddp_fork", logger=False,
                           enable_checkpointing=False, enable_progress_bar=False, default_root_dir=str(run),
                           callbacks=[ExpertStats(subsets=["all", "text"]),
                                      ExpertPruning("delta_h", ratio=0.25, allocation="global", subset="text"),
                                      _PlanPerRank(run)])
    trainer.calibrate(MoECausalLM(tiny="qwen3_moe"), datamodule=SyntheticTokens(**DATA))

    single = lp.collect_expert_stats(tiny_model("qwen3_moe"), list(SyntheticTokens(**DATA).calibration_dataloader()),
                                     subsets=("all", "text"), progress=False)
    saved = json.loads((run / "calibration.json").read_text())
    assert saved["tokens"]["all"] == single.tokens["all"] == DATA["num_samples"] * DATA["seq_len"]
    for name in single.criteria:
        for subset in ("all", "text"):
            for layer, values in single.raw(name, subset).items():
                got = torch.tensor(saved["criteria"][name][subset]["raw"][str(layer)], dtype=torch.float64)
                # fp32 forwards over differently composed batches (the sampler interleaves ranks): ~1e-7 relative
                torch.testing.assert_close(got, values, rtol=1e-6, atol=1e-9)
    plans = [lp.ExpertPlan.load(run / f"plan.rank{r}.json") for r in (0, 1)]
    expected = lp.select_experts(single.score("delta_h", "text"), 0.25, "global")
    assert plans[0].keep == plans[1].keep == expected.keep

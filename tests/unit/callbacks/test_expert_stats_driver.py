"""`lightprune calibrate`'s ExpertStats and `lp.collect_expert_stats` feed the observer through one driver
(lightprune.experts.calibration.feed.observe_batch): the same statistics, to the bit, and no loss or logits of the
output head on calibration batches."""

from __future__ import annotations

import copy
import functools

import torch

import lightprune as lp
from lightprune.callbacks import ExpertStats
from lightprune.cli.trainer import PruneTrainer
from lightprune.core.batch import head_skipped
from lightprune.experts.calibration import feed
from lightprune.experts.criteria.registry import CALIBRATION_CRITERIA as CRITERIA
from lightprune.finetune import MoECausalLM


def _batches(vocab: int) -> list[dict[str, torch.Tensor]]:
    """Padded batches with labels and a sample key, as a datamodule gives them."""
    out = []
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(3, vocab, (2, 10), generator=g)
        mask = torch.ones_like(ids)
        mask[1, 7:] = 0
        out.append({"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100),
                    "task_ids": torch.zeros(2, dtype=torch.long)})
    return out


def test_calibrate_and_the_python_api_give_identical_statistics_without_the_head(tmp_path, monkeypatch) -> None:
    module = MoECausalLM(tiny="qwen3_moe")
    module.configure_model()
    batches = _batches(module.model.config.vocab_size)
    reference = lp.collect_expert_stats(_same_model(module), batches, subsets=("all", "text"),
                                        criteria=CRITERIA, progress=False)

    calls, heads = [], []
    drive = feed.observe_batch
    monkeypatch.setattr("lightprune.callbacks.expert_stats.observe_batch",
                        lambda *a, **k: (calls.append(1), drive(*a, **k))[1])
    forward = type(module.model).forward
    head = head_skipped(module.model)

    @functools.wraps(forward)  # the same signature: head_skipped reads it
    def recording(self, *args, **kwargs):
        heads.append(kwargs.get("logits_to_keep"))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(module.model), "forward", recording)
    callback = ExpertStats(subsets=["all", "text"], criteria=list(CRITERIA))
    trainer = PruneTrainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                           enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                           callbacks=[callback])
    trainer.calibrate(module, dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))

    assert len(calls) == len(batches)  # every batch through the one driver, once
    assert head == {"logits_to_keep": 1} and heads == [1] * len(batches)  # the output head on the last position only
    assert "val/ppl" not in trainer.callback_metrics and "val/loss" not in trainer.callback_metrics
    got = callback.stats
    assert got._values.keys() == reference._values.keys()
    for key, per_layer in reference._values.items():
        for layer, value in per_layer.items():
            assert torch.equal(got._values[key][layer], value), (key, layer)
    assert got.samples == reference.samples and got.tokens == reference.tokens


def _same_model(module: MoECausalLM) -> torch.nn.Module:
    """An independent copy of the module's model (the reference pass must not share its state)."""
    return copy.deepcopy(module.model)

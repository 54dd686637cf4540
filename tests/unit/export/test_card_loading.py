"""What an export's model card says to run loads and runs it: the card's own loading lines, executed, for a float64
export (transformers' default ``grouped_mm`` experts kernel takes no float64: the export's config.json names its
``eager`` one, which a plain ``from_pretrained`` reads), written in memory and shard by shard, uniform or not."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import lightprune as lp
from lightprune.export import CARD_FILE


def _run_the_cards_lines(path: Path) -> torch.Tensor:
    card = (path / CARD_FILE).read_text()
    code = re.search(r"## Loading\n.*?```python\n(.*?)```", card, re.S).group(1)
    names: dict = {}
    exec(code.replace('"path"', repr(str(path))), names)  # noqa: S102 - the card's own lines
    return names["model"](input_ids=torch.randint(1, 100, (1, 6))).logits


@pytest.mark.parametrize("how", ["export_pruned", "prune_checkpoint", "non-uniform"])
def test_a_float64_export_loads_and_runs_as_its_card_says(tiny, tmp_path, how):
    model = tiny("qwen3_moe").to(torch.float64)
    keep = {0: [0, 1, 2, 3], 1: [0, 1, 2, 3, 4, 5], 2: [1, 2, 3]} if how == "non-uniform" else \
        {layer: [0, 1, 2, 3] for layer in range(3)}
    plan = lp.ExpertPlan(keep=keep, num_experts={layer: 8 for layer in keep})
    out = tmp_path / "out"
    if how == "prune_checkpoint":
        model.save_pretrained(tmp_path / "ckpt")
        lp.prune_checkpoint(tmp_path / "ckpt", plan, out, progress=False)
    else:
        lp.export_pruned(model, plan, out)
    assert json.loads((out / "config.json").read_text())["experts_implementation"] == "eager"
    assert "`eager` implementation" in (out / CARD_FILE).read_text()
    assert _run_the_cards_lines(out).dtype == torch.float64


def test_a_float32_export_keeps_transformers_default_experts_kernel(tiny, tmp_path):
    plan = lp.ExpertPlan(keep={layer: [0, 1, 2, 3] for layer in range(3)}, num_experts={layer: 8 for layer in range(3)})
    lp.export_pruned(tiny("qwen3_moe"), plan, tmp_path / "out")
    assert "experts_implementation" not in json.loads((tmp_path / "out" / "config.json").read_text())
    assert "`eager`" not in (tmp_path / "out" / CARD_FILE).read_text()
    assert _run_the_cards_lines(tmp_path / "out").dtype == torch.float32

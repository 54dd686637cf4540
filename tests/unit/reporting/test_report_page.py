"""report.md: the tables carry the run JSON's numbers, every image it names exists beside it as a valid PNG,
it is rebuilt after the fact from the files alone, and the ReportPage callback writes it at the end of a run."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import torch
from fixtures import FIXTURES

from lightprune.experts.plan import ExpertPlan
from lightprune.reporting.page import fmt, main, write_report_page
from lightprune.width.plan import WidthPlan
from lightprune.width.search import Candidate, StagedSearch

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _images(page: str, run_dir: Path) -> list[Path]:
    names = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page)
    assert names and all(not Path(n).is_absolute() and "/" not in n for n in names)  # beside report.md
    return [run_dir / n for n in names]


def _check_pngs(paths: list[Path]) -> None:
    from PIL import Image

    for path in paths:
        assert path.read_bytes()[:8] == PNG_MAGIC, path
        with Image.open(path) as im:
            im.verify()
            assert im.format == "PNG" and im.size[0] > 100 and im.size[1] > 100


def _expert_run(run_dir: Path) -> dict:
    plan = ExpertPlan(keep={0: [1, 2], 1: [0, 3]}, num_experts={0: 4, 1: 4}, criterion="magnitude", ratio=0.5)
    plan.save(run_dir / "plan.json")
    scores = {"magnitude": {"criterion": "magnitude", "importance": {"0": [0.1, 0.9, 0.8, 0.2], "1": [0.7, 0.1, 0.3, 0.6]},
                            "raw": {"0": [0.1, 0.9, 0.8, 0.2], "1": [0.7, 0.1, 0.3, 0.6]}}}
    (run_dir / "scores.json").write_text(json.dumps(scores))
    report = {"source": "tiny:qwen3_moe", "criterion": "magnitude", "ratio": 0.5, "allocation": "uniform",
              "experts_before": 8, "experts_after": 4, "params_before": 123456, "params_after": 98765,
              "checkpoint_bytes_before": None, "checkpoint_bytes_after": 402112, "max_abs_diff": 3.0517578125e-07,
              "seconds_scoring": 0.0123, "seconds_export": 1.5, "checkpoint_dir": str(run_dir / "model"),
              "evaluation": {"split": "test", "metric": "token", "task_names": ["default"],
                             "before": {"perplexity": 301.234567, "loss": 5.7079, "next_token_accuracy": 0.125,
                                        "task_accuracy": {"default": 0.125}, "tokens": 40, "samples": 8,
                                        "lm_eval": {"tiny": {"acc,none": 0.6, "acc_stderr,none": 0.2}}},
                             "after": {"perplexity": 355.5, "loss": 5.8735, "next_token_accuracy": 0.075,
                                       "task_accuracy": {"default": 0.075}, "tokens": 40, "samples": 8,
                                       "lm_eval": {"tiny": {"acc,none": 0.4, "acc_stderr,none": 0.24}}}}}
    (run_dir / "report.json").write_text(json.dumps(report))
    return report


def test_expert_run_page(tmp_path) -> None:
    report = _expert_run(tmp_path)
    page = write_report_page(tmp_path).read_text()
    assert "| routed experts | 8 | 4 |" in page
    assert "| parameters | 123,456 | 98,765 |" in page
    assert "| checkpoint bytes | - | 402,112 |" in page
    assert f"| {fmt(report['max_abs_diff'])} | 0.0123 | 1.5 |" in page
    # kept experts per layer: the plan's counts and the pruned ids (the complement of keep)
    assert "| 0 | 4 | 2 | 0 3 |" in page and "| 1 | 4 | 2 | 1 2 |" in page
    ev = report["evaluation"]
    assert f"| perplexity | {fmt(ev['before']['perplexity'])} | {fmt(ev['after']['perplexity'])} |" in page
    assert "| perplexity | 301.2 | 355.5 |" in page  # fmt: 4 significant digits
    assert "| next-token accuracy | 0.125 | 0.075 |" in page
    assert "accuracy: default" not in page  # a text set's one "token" task is next-token accuracy: shown once
    assert "| lm-eval tiny: acc,none | 0.6 | 0.4 |" in page and "stderr" not in page
    images = _images(page, tmp_path)
    assert {p.name for p in images} == {"kept_experts.png", "scores_magnitude.png", "evaluation.png"}
    _check_pngs(images)


def _search() -> tuple[dict, dict]:
    search = StagedSearch(grid=[0.0, 0.5, 1.0], stages=["v2v", "t2v"], min_retention=90.0, max_candidates=2,
                          expand_above=200.0)
    plan = {"stage": "x"}
    results = {"v2v": ({0.0: 100.0, 0.5: 97.5, 1.0: 80.0}, {0.5: 101.25, 0.0: 100.5}),
               "t2v": ({0.0: 101.0, 0.5: 93.0, 1.0: 91.0}, {1.0: 92.5, 0.5: 99.0})}
    flops = {("v2v", 0.5): 900.0, ("v2v", 0.0): 1000.0, ("t2v", 1.0): 700.0, ("t2v", 0.5): 800.0}
    for stage, (sweep, recovered) in results.items():
        search.start_stage(sweep)
        while (ratio := search.next_ratio()) is not None:
            search.record(Candidate(stage, ratio, plan, recovered[ratio], {"a": recovered[ratio]}, flops[stage, ratio]))
        search.finish_stage()
    best = search.final()
    width = WidthPlan.from_dict({
        "attn_keep": {"0": [[1, 0, 1], [0, 0, 1]], "1": [[1, 1, 1], [1, 0, 1]]},
        "ffn_keep": {"0": {"vision": [1, 0, 0, 1], "text": [1, 1, 1, 0]}, "1": {"vision": [0, 0, 0, 1], "text": [1, 1, 1, 1]}},
        "num_heads": {"0": 2, "1": 2}, "intermediate_size": {"0": 4, "1": 4},
        "metadata": {"method": "mwop", "atr": best.atr, "flops": best.flops, "flops_fraction": best.flops / 1250.0,
                     "chosen": best.label()}}).to_dict()
    return {"chosen": best.label(), "reference": [0.5, 0.25], "task_names": ["count", "color"],
            "flops_profile": [10, 6], "search": search.to_dict()}, width


def test_mwop_run_page(tmp_path) -> None:
    search, width = _search()
    assert search["chosen"] == "t2v@0.5"  # closest to 100 in the last stage; no earlier one beats it on both counts
    (tmp_path / "search.json").write_text(json.dumps(search))
    (tmp_path / "width_plan.json").write_text(json.dumps(width))
    report = {"method": "mwop", "checkpoint": str(tmp_path / "model"), "checkpoint_bytes": 136661,
              "pruned_fractions": {"v2v": 0.25, "t2v": 0.5, "t2t": 0.0, "ffn_vision": 0.625, "ffn_text": 0.125},
              "search": width["metadata"], "verification": {"max_abs_diff": 1.2e-07}, "seconds": 6.5}
    (tmp_path / "report.json").write_text(json.dumps(report))
    main([str(tmp_path)])  # python -m lightprune.reporting.page RUN_DIR
    page = (tmp_path / "report.md").read_text()
    assert "Chosen candidate: **t2v@0.5**" in page
    assert "| count | 0.5 |" in page and "| color | 0.25 |" in page
    # every recovered candidate: training-free ATR from the sweep, recovered ATR, FLOPs / dense (1250)
    # anchors: the ATR closest to 100 per stage (v2v@0 at 100.5, t2v@0.5 at 99)
    rows = [("v2v", 0.5, 97.5, 101.25, 900.0, "false", "false"), ("v2v", 0, 100.0, 100.5, 1000.0, "true", "false"),
            ("t2v", 1, 91.0, 92.5, 700.0, "false", "false"), ("t2v", 0.5, 93.0, 99.0, 800.0, "true", "true")]
    for stage, ratio, free, atr, flops, anchor, chosen in rows:
        assert f"| {stage} | {fmt(ratio)} | {fmt(free)} | {fmt(atr)} | {fmt(flops)} | {fmt(flops / 1250.0)} | " \
               f"{anchor} | {chosen} |" in page
    assert "| 99 | 800 | 0.64 | t2v@0.5 |" in page
    # the chosen plan's pruned fractions, counted by hand from the masks above
    for unit, frac in {"v2v": 1 / 4, "t2v": 3 / 4, "t2t": 0.0, "ffn_vision": 5 / 8, "ffn_text": 1 / 8}.items():
        assert f"| {unit} | {fmt(frac)} |" in page
    assert "| 1.2e-07 |" in page and "| 136,661 |" in page
    images = _images(page, tmp_path)
    assert [p.name for p in images] == ["retention_vs_ratio.png"]
    _check_pngs(images)


def test_page_bad_inputs(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        write_report_page(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="none of the run files"):
        write_report_page(tmp_path)
    (tmp_path / "report.json").write_text("{truncated")
    with pytest.raises(ValueError, match="report.json is not valid JSON"):
        write_report_page(tmp_path)
    assert not (tmp_path / "report.md").exists()


def test_report_page_callback_after_export_and_evaluate(tmp_path, caplog) -> None:
    from lightprune.callbacks import Evaluate, ExpertPruning, Export, ReportPage
    from lightprune.cli.trainer import PruneTrainer
    from lightprune.data import TextJsonlDataModule, train_bpe_tokenizer
    from lightprune.finetune import MoECausalLM

    text = FIXTURES / "data" / "text.jsonl"
    train_bpe_tokenizer([line for line in text.read_text().splitlines()] * 4, 300).save_pretrained(tmp_path / "tok")
    dm = TextJsonlDataModule(str(tmp_path / "tok"), test=str(text), batch_size=4)
    run = tmp_path / "run"
    # ReportPage listed first: it runs the pruning, the export and the evaluation before writing
    callbacks = [ReportPage(), Evaluate(data=dm, progress=False), ExpertPruning(criterion="magnitude", ratio=0.5),
                 Export(summary=False)]
    trainer = PruneTrainer(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=run,
                           callbacks=callbacks, enable_progress_bar=False)
    torch.manual_seed(0)
    with caplog.at_level(logging.INFO):
        trainer.export(MoECausalLM(tiny="qwen3_moe", tiny_overrides={"vocab_size": 300, "num_hidden_layers": 2}))
    assert f"ReportPage: wrote {run / 'report.md'}" in caplog.messages  # the run says where the page went
    report = json.loads((run / "report.json").read_text())
    page = (run / "report.md").read_text()
    ev = report["evaluation"]
    assert f"| perplexity | {fmt(ev['before']['perplexity'])} | {fmt(ev['after']['perplexity'])} |" in page
    assert f"| routed experts | {report['experts_before']} | {report['experts_after']} |" in page
    _check_pngs(_images(page, run))


def test_a_merge_run_lists_its_clusters_with_the_dominant_in_bold(tmp_path) -> None:
    from lightprune.experts.merging import MergePlan

    merge = MergePlan(clusters={0: [[0, 2, 3], [1]], 3: [[0, 1], [2, 3]]}, dominant={0: [2, 1], 3: [1, 2]},
                         coefficients={0: [[0.5, 0.25, 0.25], [1.0]], 3: [[0.5, 0.5], [0.5, 0.5]]},
                         num_experts={0: 4, 3: 4}, method="m_smoe", align=True)
    merge.save(tmp_path / "merge_plan.json")
    text = write_report_page(tmp_path).read_text()
    assert "## Merged experts per layer" in text and "Method `m_smoe`, router `dominant`, aligned yes" in text
    assert "| 0 | 4 | 2 | 0 **2** 3 |" in text and "| 3 | 4 | 2 | 0 **1**, **2** 3 |" in text


def test_the_page_is_written_without_torch_or_lightning(tmp_path) -> None:
    """`python -m lightprune.reporting.page RUN` reads JSON and draws PNGs: it imports neither torch nor Lightning
    (which is what made it take 20 s)."""
    import subprocess
    import sys

    _expert_run(tmp_path)
    code = ("import runpy, sys\n"
            f"sys.argv = ['page', {str(tmp_path)!r}]\n"
            "try:\n    runpy.run_module('lightprune.reporting.page', run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'torch', 'transformers'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert "| routed experts | 8 | 4 |" in (tmp_path / "report.md").read_text()

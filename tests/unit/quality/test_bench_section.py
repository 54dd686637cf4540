"""Benchmark figures as JSON and as a Markdown section: scripts/bench_export.py --quick against an independent
count of the checkpoint's bytes, scripts/collect_benchmarks.py on the export bench, and the rendered tables."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fixtures import REPO

ROOT = REPO


def _run(args: list[str], timeout: int = 180) -> subprocess.CompletedProcess:
    run = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    return run


def _check(figures: dict, prefix: str) -> dict:
    found = [c for c in figures["checks"] if c["name"].startswith(prefix)]
    assert len(found) == 1, [c["name"] for c in figures["checks"]]
    return found[0]


@pytest.mark.exhaustive
def test_bench_export_bytes_against_the_reloaded_safetensors(tmp_path):
    from safetensors import safe_open

    out, ckpt = tmp_path / "export.json", tmp_path / "ckpt"
    run = _run(["scripts/bench_export.py", "--quick", "--json", str(out), "--out-dir", str(ckpt)])
    figures = json.loads(out.read_text())
    files = sorted(ckpt.glob("*.safetensors"))
    assert files and (ckpt / "lightprune_export.json").is_file()

    # independent count: every tensor of the written checkpoint, numel x itemsize
    stored, names = 0, set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                t = f.get_tensor(key)
                stored += t.numel() * t.element_size()
                names.add(key)
    on_disk = sum(f.stat().st_size for f in files)
    manifest = json.loads((ckpt / "lightprune_export.json").read_text())
    assert figures["bytes"]["expected"] == stored == manifest["parameter_bytes"]
    assert figures["bytes"]["checkpoint"] == on_disk
    assert figures["bytes"]["data"] == stored and figures["bytes"]["header"] == on_disk - stored

    ratio = _check(figures, "checkpoint bytes / expected bytes")
    assert ratio["value"] == pytest.approx(on_disk / stored)
    assert 1.0 < ratio["value"] <= 1.01 and ratio["passed"] is True and ratio["target"] == 1.01
    assert _check(figures, "tensor data bytes on disk")["value"] == 0

    # half of each layer's experts were removed: the expert tensors hold half the experts
    shapes = figures["shapes"]
    kept = figures["params"]["kept_per_layer"]
    assert len(kept) == shapes["layers"] and set(kept.values()) == {shapes["experts"] // 2}
    smaller = _check(figures, "pruned / unpruned checkpoint bytes")
    assert 0.5 < smaller["value"] < 1.0 and smaller["value"] == pytest.approx(smaller["reference"], abs=0.01)
    assert figures["bytes"]["unpruned_expected"] > stored
    assert figures["passed"] is True and figures["torch_threads"] >= 1
    assert "PASS: checkpoint bytes / expected bytes" in run.stdout


@pytest.mark.exhaustive
def test_collect_export_and_render_markdown(tmp_path):
    from lightprune.quality.bench_section import benchmarks_markdown, format_value

    out = tmp_path / "all.json"
    _run(["scripts/collect_benchmarks.py", "--out", str(out), "--quick", "--bench", "export"])
    collected = json.loads(out.read_text())
    assert set(collected) == {"export", "machine", "commands"}
    assert collected["machine"]["cpu_count"] >= 1 and collected["machine"]["torch_version"]
    assert collected["commands"]["export"] == "python scripts/bench_export.py --quick"
    figures = collected["export"]
    assert figures["exit_code"] == 0 and "error" not in figures

    text = benchmarks_markdown(collected)
    assert "### Export: time and checkpoint bytes (`export`)" in text
    assert "Measured by: `python scripts/bench_export.py --quick`" in text
    rows = {line.split(" | ")[0].lstrip("| ").replace("\\|", "|"): line for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| figure")}
    for check in figures["checks"]:
        row = rows[check["name"]]
        assert f"| {format_value(check['value'])} |" in row, row
        if check["target"] is not None:
            assert f"| {check['op']} {format_value(check['target'])} | {'PASS' if check['passed'] else 'FAIL'} |" in row
        if check["reference"] is not None:
            assert format_value(check["reference"]) in row
    ratio = _check(figures, "checkpoint bytes / expected bytes")
    assert f"| {ratio['value']:.4g} |  | <= 1.01 | PASS |" in rows[ratio["name"]]
    assert f"{figures['bytes']['expected']:,}" in text and "1 of 1 judged benchmarks PASS" in text

    # --merge keeps another bench's figures from the existing file, a plain run replaces the file
    kept = {"benchmark": "other", "checks": [], "passed": None}
    out.write_text(json.dumps({**collected, "other": kept, "commands": {**collected["commands"], "other": "x"}}))
    _run(["scripts/collect_benchmarks.py", "--out", str(out), "--quick", "--bench", "export", "--merge"])
    merged = json.loads(out.read_text())
    assert merged["other"] == kept and merged["commands"]["other"] == "x"
    assert merged["export"]["exit_code"] == 0 and merged["commands"]["export"] == collected["commands"]["export"]


def test_markdown_of_a_failed_and_a_failing_bench():
    from lightprune.quality.bench_section import benchmarks_markdown

    collected = {
        "calibration": {"title": "Calibration overhead", "what": "collect vs plain.", "torch_threads": 2,
                        "repeats": 5, "shapes": {"layers": 4, "seq": 256},
                        "times_s": {"plain forward": {"median": 0.25, "min": 0.2}},
                        "checks": [{"name": "collect / plain (min)", "value": 1.75, "target": 1.5, "op": "<=",
                                    "passed": False, "reference": None, "reference_name": None, "note": ""}],
                        "passed": False, "exit_code": 0},
        "prefill": {"error": "no figures written", "exit_code": 1, "stderr_tail": "Traceback\nValueError: boom"},
        "machine": {"cpu_count": 2, "torch_version": "2.x", "torch_threads": 2},
        "commands": {"calibration": "python scripts/bench_calibration.py",
                     "prefill": "python scripts/bench_prefill.py"},
    }
    text = benchmarks_markdown(collected)
    assert "| collect / plain (min) | 1.75 |  | <= 1.5 | FAIL |" in text
    assert "Shapes: layers 4, seq 256; torch threads 2; repeats 5." in text
    assert "plain forward 0.25 / 0.2" in text and "Overall: **FAIL**." in text
    assert "**Did not run to the end**: no figures written (exit code 1)." in text and "ValueError: boom" in text
    assert "Measured by: `python scripts/bench_prefill.py`" in text
    assert "0 of 1 judged benchmarks PASS; did not run: prefill." in text
    assert "Machine: cpu_count 2, torch_version 2.x, torch_threads 2." in text

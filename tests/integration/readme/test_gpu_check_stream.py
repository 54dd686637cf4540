"""scripts/gpu_check.py's ``stream`` part (the streamed paths on a GPU) checked on the CPU: it runs end to end, its
streamed calibration equals the in-memory one exactly, and it prints every figure the GPU run is read for."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.exhaustive  # the exhaustive tier only: the GPU check's script in a subprocess


ROOT = Path(__file__).resolve().parents[3]


def test_the_stream_part_runs_on_the_cpu_and_prints_its_figures(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "stream", "--cpu-smoke",
                           "--work-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert re.search(r"streamed / in memory \(tok/s\) \d+\.\d+ \(target >= 0\.8\); largest difference of the "
                     r"statistics 0\.0e\+00 of their scale", out), out
    assert re.search(r"every criterion [\d.]+ s / plain forward [\d.]+ s = [\d.]+ \(target <= 1\.3\)", out), out
    assert re.search(r"prune with verification on cpu [\d.]+ s / copy [\d.]+ s = [\d.]+ \(target <= 1\.0\)", out), out
    for name in ("Qwen3-235B-A22B", "Kimi K2 \\(1T\\)"):
        assert re.search(rf"{name}: calibration over 2M tokens ~[\d.]+ hours on cpu", out), out
    assert list(tmp_path.iterdir()) == []  # the checkpoint and its copies are gone

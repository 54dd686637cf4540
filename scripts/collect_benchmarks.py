"""Run the benchmark scripts one after another and merge their ``--json`` figures into one JSON file.

Each bench runs in its own process (never two at once, so they do not time each other), with ``--json`` to a
temporary file. The output is ``{name: figures, "machine": {...}, "commands": {name: command line}}``; a bench
that writes no figures is recorded as ``{"error": ..., "exit_code": ..., "stderr_tail": ...}`` and the others
still run. A bench whose figures say FAIL keeps its figures (and its exit code); ``--merge`` keeps the figures of
the benches not run from an existing output file. Render the result with
:func:`lightprune.quality.bench_section.benchmarks_markdown`.

    python scripts/collect_benchmarks.py --out results/benchmarks.json [--quick] [--bench export --bench prefill]
        [--merge]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lightprune.core.jsonio import read_json

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["BENCHES", "collect", "main"]

#: name -> (script under scripts/, extra arguments always passed, extra arguments under --quick)
BENCHES = {
    "calibration": ("bench_calibration.py", [], ["--quick"]),
    "weight_scores": ("bench_weight_scores.py", [], ["--quick"]),
    "prefill": ("bench_prefill.py", [], ["--quick", "--device", "cpu"]),
    "export": ("bench_export.py", [], ["--quick"]),
    "taylor": ("bench_taylor.py", [], ["--quick"]),
    "out_of_core": ("bench_out_of_core.py", [], ["--quick"]),
    "cli": ("bench_cli.py", [], ["--quick"]),
    "quickstart": ("quickstart_vs_random.py", [], ["--seeds", "2"]),
}
STDERR_TAIL = 4000


def machine() -> dict:
    import torch

    return {"cpu_count": os.cpu_count(), "torch_version": torch.__version__, "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "platform": platform.platform(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def run_one(name: str, quick: bool, timeout: float | None, workdir: Path) -> tuple[dict, str]:
    """Run bench ``name``; returns (its figures or an error record, its command line without ``--json``)."""
    script, extra, quick_extra = BENCHES[name]
    args = [str(Path("scripts") / script), *extra, *(quick_extra if quick else [])]
    shown = shlex.join(["python", *args])
    out = workdir / f"{name}.json"
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, *args, "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as err:
        tail = (err.stderr or b"")[-STDERR_TAIL:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        return {"error": f"timed out after {timeout} s", "exit_code": None, "stderr_tail": tail}, shown
    seconds = time.perf_counter() - start
    if not out.is_file():
        return {"error": "no figures written", "exit_code": done.returncode, "seconds": seconds,
                "stderr_tail": done.stderr[-STDERR_TAIL:] or done.stdout[-STDERR_TAIL:]}, shown
    try:
        figures = read_json(out, "figures")
    except ValueError as err:  # not JSON, or past the readers' limits
        return {"error": str(err), "exit_code": done.returncode, "seconds": seconds,
                "stderr_tail": done.stderr[-STDERR_TAIL:]}, shown
    figures["exit_code"], figures["seconds"] = done.returncode, seconds
    return figures, shown


def collect(names: list[str], quick: bool = False, timeout: float | None = None) -> dict:
    """Run the benches ``names`` sequentially; the merged dict (see the module docstring)."""
    merged: dict = {}
    commands: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="collect_benchmarks_") as work:
        for name in names:
            print(f"{name}: running ...", flush=True)
            merged[name], commands[name] = run_one(name, quick, timeout, Path(work))
            figures = merged[name]
            state = (f"error: {figures['error']}" if "error" in figures else
                     {True: "PASS", False: "FAIL", None: "no target"}[figures.get("passed")])
            print(f"{name}: {state} ({commands[name]})", flush=True)
    merged["machine"] = machine()
    merged["commands"] = commands
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, metavar="PATH.json", help="the merged JSON")
    parser.add_argument("--quick", action="store_true", help="pass each bench its small, seconds-long settings")
    parser.add_argument("--bench", action="append", choices=sorted(BENCHES), default=None,
                        help="run only this bench (repeatable; default: all, in the order "
                             f"{', '.join(BENCHES)})")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per bench (default: none)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other benches' figures (and commands) of an existing --out file")
    args = parser.parse_args(argv)
    names = [name for name in BENCHES if args.bench is None or name in args.bench]
    merged = collect(names, quick=args.quick, timeout=args.timeout)
    if args.merge and args.out.is_file():
        previous = read_json(args.out, "benchmarks")
        commands = {**previous.get("commands", {}), **merged["commands"]}
        merged = {**{k: v for k, v in previous.items() if k not in ("machine", "commands")}, **merged,
                  "commands": commands}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(merged, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

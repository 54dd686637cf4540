"""Responsiveness of the command line: `lightprune --help`, a bad option's error and the report page, each as the
wall time of a fresh process (min of the repeats), beside the import of Lightning that none of them may need.

Target (issue 20): each at most 2 s on 2 CPU cores. The report page is written for a real run directory, made
first by `lightprune export --config configs/aimer_tiny.yaml` (not timed).

    python scripts/bench_cli.py [--repeats 3] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_figures import check, write_json  # noqa: E402  (scripts/ is on sys.path when a script runs)

ROOT = Path(__file__).resolve().parents[1]
COMMAND = [sys.executable, "-m", "lightprune.cli.command"]


def timed(args: list[str], expect: int) -> float:
    """Wall seconds of ``args`` in a fresh process, which must exit with ``expect``."""
    start = time.perf_counter()
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    if done.returncode != expect:
        raise SystemExit(f"{' '.join(args)} exited {done.returncode}, not {expect}:\n{done.stderr[-2000:]}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None, help="default 3 (quick 1)")
    parser.add_argument("--target", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true", help="one repeat: checks the script, not the target")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        timed([*COMMAND, "export", "--config", "configs/aimer_tiny.yaml", "--trainer.default_root_dir", str(run),
               "--export.summary", "false"], 0)
        cases = {
            "lightprune --help": ([*COMMAND, "--help"], 0),
            "unknown criterion (--prune.criterion reapp)": (
                [*COMMAND, "export", "--config", "configs/aimer_tiny.yaml", "--prune.criterion", "reapp"], 2),
            "bad ratio (--trainer.callbacks.init_args.ratio abc)": (
                [*COMMAND, "calibrate", "--config", "configs/reap_testbed.yaml", "--trainer.callbacks.init_args.ratio",
                 "abc"], 2),
            "report page (python -m lightprune.reporting.page RUN)": (
                [sys.executable, "-m", "lightprune.reporting.page", str(run)], 0),
            "reference: import lightning.pytorch": ([sys.executable, "-c", "import lightning.pytorch"], 0),
        }
        times = {name: [] for name in cases}
        for _ in range(repeats):  # interleaved: every case sees the same machine state
            for name, (command, expect) in cases.items():
                times[name].append(timed(command, expect))
    best = {name: min(t) for name, t in times.items()}
    print(f"fresh-process wall time, min of {repeats} (target <= {args.target} s each)")
    checks = []
    for name, seconds in best.items():
        print(f"  {name:58s} {seconds:6.2f} s")
        if not name.startswith("reference"):
            checks.append(check(f"{name} (s)", seconds, args.target, "<=",
                                reference=best["reference: import lightning.pytorch"],
                                reference_name="import lightning.pytorch (s)"))
    passed = all(c["passed"] for c in checks)
    print("quick run: figures check the script, not the target" if args.quick else
          f"{'PASS' if passed else 'FAIL'}: every one <= {args.target} s")
    write_json(args.json, {"benchmark": "cli", "title": "Command-line responsiveness",
                           "what": " ".join(__doc__.split("\n\n")[0].split()), "quick": args.quick,
                           "repeats": repeats, "wall_s": best, "checks": checks, "passed": passed})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

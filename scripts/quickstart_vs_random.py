"""The quickstart job's recipe against random pruning: the shipped configs/quickstart.yaml once, and the same job
with ``--prune.criterion random`` for several seeds (the same fit, data, ratio and Evaluate), side by side.

Each run is ``lightprune fit --config configs/quickstart.yaml`` in its own process and output directory; the figure
is Evaluate's perplexity retention (dense / pruned, in %, on the val batches the job evaluates), read from the
run's report.json. PASS when the shipped recipe keeps more than random's best seed.

    python scripts/quickstart_vs_random.py [--seeds 5] [--out DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_figures import check, write_json  # noqa: E402  (scripts/ is on sys.path when a script runs)

ROOT = Path(__file__).resolve().parents[1]


def run(out: Path, *extra: str) -> dict:
    """One quickstart job into ``out``; Evaluate's before / after perplexity from its report.json."""
    command = [sys.executable, "-m", "lightprune.command", "fit", "--config", str(ROOT / "configs" / "quickstart.yaml"),
               "--trainer.default_root_dir", str(out), *extra]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    evaluation = json.loads((out / "report.json").read_text())["evaluation"]
    before, after = evaluation["before"]["perplexity"], evaluation["after"]["perplexity"]
    return {"before": before, "after": after, "retention": 100.0 * before / after}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="random seeds (default 5)")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    base = args.out or Path(tempfile.mkdtemp(prefix="quickstart-vs-random-"))
    try:
        shipped = run(base / "shipped")
        print(f"quickstart as shipped: perplexity {shipped['before']:.1f} -> {shipped['after']:.1f}, retention "
              f"{shipped['retention']:.1f}%", flush=True)
        randoms = []
        for seed in range(args.seeds):
            r = run(base / f"random-{seed}", "--prune.criterion", "random", "--prune.seed", str(seed))
            randoms.append(r)
            print(f"random seed {seed}: perplexity {r['before']:.1f} -> {r['after']:.1f}, retention "
                  f"{r['retention']:.1f}%", flush=True)
    finally:
        if args.out is None:
            shutil.rmtree(base, ignore_errors=True)
    kept = [r["retention"] for r in randoms]
    mean = sum(kept) / len(kept)
    print(f"random ({args.seeds} seeds): mean {mean:.1f} [{min(kept):.1f}, {max(kept):.1f}]")
    checks = [check("quickstart retention - random's best seed (points)", shipped["retention"] - max(kept), 0.0, ">")]
    passed = all(c["passed"] for c in checks)
    print(f"{'PASS' if passed else 'FAIL'}: the shipped recipe keeps more than random's best seed")
    if args.json is not None:
        write_json(args.json, {"benchmark": "quickstart_vs_random", "title": "The quickstart recipe against random",
                               "what": " ".join(__doc__.split("\n\n")[0].split()), "shipped": shipped,
                               "random": randoms, "checks": checks, "passed": passed})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

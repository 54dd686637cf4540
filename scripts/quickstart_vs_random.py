"""The quickstart job's recipe against random pruning: configs/quickstart.yaml as shipped (REAP from one calibration
pass) and the same job with ``--prune.criterion random`` for several seeds (the same calibration data, ratio and
Evaluate), side by side.

Each run is ``lightprune calibrate --config configs/quickstart.yaml`` in its own process and output directory; the
figure is Evaluate's perplexity retention (dense / pruned, in %, on the val batches the job evaluates), read from
the run's report.json. The recipe has no random state (the calibration batches come in file order), so it runs
once. PASS when its empirical p-value against the random runs, (1 + #{random >= recipe}) / (1 + seeds)
(lightprune.quality.evidence), is below 0.05: at least 19 seeds, the default 20.

    python scripts/quickstart_vs_random.py [--seeds 20] [--out DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_figures import check, write_json  # noqa: E402  (scripts/ is on sys.path when a script runs)

from lightprune.core.jsonio import read_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def run(out: Path, *extra: str) -> dict:
    """One quickstart job into ``out``; Evaluate's before / after perplexity from its report.json."""
    command = [sys.executable, "-m", "lightprune.cli.command", "calibrate", "--config",
               str(ROOT / "configs" / "quickstart.yaml"),
               "--trainer.default_root_dir", str(out), *extra]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    evaluation = read_json(out / "report.json", "report")["evaluation"]
    before, after = evaluation["before"]["perplexity"], evaluation["after"]["perplexity"]
    return {"before": before, "after": after, "retention": 100.0 * before / after}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="random seeds, the null (default 20)")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    base = args.out or Path(tempfile.mkdtemp(prefix="quickstart-vs-random-"))
    try:
        recipe = run(base / "recipe")
        print(f"quickstart: perplexity {recipe['before']:.1f} -> {recipe['after']:.1f}, retention "
              f"{recipe['retention']:.1f}%", flush=True)
        randoms = []
        for seed in range(args.seeds):
            r = run(base / f"random-{seed}", "--prune.criterion", "random", "--prune.seed", str(seed))
            randoms.append({"seed": seed, **r})
            print(f"random seed {seed}: perplexity {r['before']:.1f} -> {r['after']:.1f}, retention "
                  f"{r['retention']:.1f}%", flush=True)
    finally:
        if args.out is None:
            shutil.rmtree(base, ignore_errors=True)
    from lightprune.quality.claims import P_LEVEL
    from lightprune.quality.evidence import empirical_p_value

    kept = [r["retention"] for r in randoms]
    mean = sum(kept) / len(kept)
    p = empirical_p_value(recipe["retention"], kept)
    print(f"quickstart: {recipe['retention']:.1f}; random ({args.seeds} seeds): mean {mean:.1f} "
          f"[{min(kept):.1f}, {max(kept):.1f}]; p {p:.3f}")
    checks = [check("p-value of the quickstart's retention among the random runs'", p, P_LEVEL, "<",
                    note=f"quickstart {recipe['retention']:.1f}, random {mean:.1f} [{min(kept):.1f}, {max(kept):.1f}] "
                    f"over {args.seeds} seeds"),
              check("quickstart retention - random's mean (points)", recipe["retention"] - mean),
              check("quickstart retention (%)", recipe["retention"])]
    passed = checks[0]["passed"]
    print(f"{'PASS' if passed else 'FAIL'}: the recipe's p-value against the random runs is below {P_LEVEL}")
    if args.json is not None:
        write_json(args.json, {"benchmark": "quickstart_vs_random", "title": "The quickstart recipe against random",
                               "what": " ".join(__doc__.split("\n\n")[0].split()), "recipe": recipe,
                               "random": randoms, "checks": checks, "passed": passed})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

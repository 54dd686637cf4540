"""The quickstart job's recipe against random pruning: configs/quickstart.yaml as shipped and with other fit seeds
(``--seed_everything``), and the same job with ``--prune.criterion random`` for several seeds (the same data, ratio
and Evaluate; Export prunes the original weights, so a random plan does not depend on the fit and its runs fit
one step), side by side.

Each run is ``lightprune fit --config configs/quickstart.yaml`` in its own process and output directory; the figure
is Evaluate's perplexity retention (dense / pruned, in %, on the val batches the job evaluates), read from the
run's report.json. PASS when the recipe, averaged over its fit seeds, keeps more than random's best seed.

    python scripts/quickstart_vs_random.py [--fit-seeds 3] [--seeds 5] [--out DIR] [--json PATH]
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
    parser.add_argument("--fit-seeds", type=int, default=3,
                        help="fit seeds of the recipe: the shipped one, then 1, 2, ... (default 3)")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.fit_seeds < 1:
        parser.error(f"--seeds and --fit-seeds must be >= 1, got {args.seeds} and {args.fit_seeds}")
    base = args.out or Path(tempfile.mkdtemp(prefix="quickstart-vs-random-"))
    try:
        recipe = []
        for seed in range(args.fit_seeds):
            r = run(base / f"recipe-{seed}", *(("--seed_everything", str(seed)) if seed else ()))
            recipe.append({"fit_seed": "shipped" if seed == 0 else seed, **r})
            print(f"quickstart, fit seed {recipe[-1]['fit_seed']}: perplexity {r['before']:.1f} -> {r['after']:.1f}, "
                  f"retention {r['retention']:.1f}%", flush=True)
        randoms = []
        for seed in range(args.seeds):
            r = run(base / f"random-{seed}", "--prune.criterion", "random", "--prune.seed", str(seed),
                    "--trainer.max_steps", "1")
            randoms.append(r)
            print(f"random seed {seed}: perplexity {r['before']:.1f} -> {r['after']:.1f}, retention "
                  f"{r['retention']:.1f}%", flush=True)
    finally:
        if args.out is None:
            shutil.rmtree(base, ignore_errors=True)
    kept = [r["retention"] for r in randoms]
    ours = [r["retention"] for r in recipe]
    mean, our_mean = sum(kept) / len(kept), sum(ours) / len(ours)
    print(f"quickstart ({args.fit_seeds} fit seeds): mean {our_mean:.1f} [{min(ours):.1f}, {max(ours):.1f}]; "
          f"random ({args.seeds} seeds): mean {mean:.1f} [{min(kept):.1f}, {max(kept):.1f}]")
    checks = [check("quickstart retention, mean over fit seeds - random's best seed (points)", our_mean - max(kept),
                    0.0, ">", note=f"quickstart {our_mean:.1f} [{min(ours):.1f}, {max(ours):.1f}], random {mean:.1f} "
                    f"[{min(kept):.1f}, {max(kept):.1f}]"),
              check("quickstart retention as shipped (%)", recipe[0]["retention"])]
    passed = checks[0]["passed"]
    print(f"{'PASS' if passed else 'FAIL'}: the recipe keeps more than random's best seed")
    if args.json is not None:
        write_json(args.json, {"benchmark": "quickstart_vs_random", "title": "The quickstart recipe against random",
                               "what": " ".join(__doc__.split("\n\n")[0].split()), "recipe": recipe,
                               "random": randoms, "checks": checks, "passed": passed})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

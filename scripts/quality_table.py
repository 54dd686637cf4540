"""Side-by-side quality tables on the trained testbeds -> docs/RESULTS.md (with PNG plots).

Trains (first time only; cached under --root, $LIGHTPRUNE_CACHE or ~/.cache/lightprune) each testbed from every
seed of --testbed-seeds and then measures on each, at 25% and 50% expert pruning, every criterion (random over
--random-seeds plans, the null each criterion is judged against,
frequency, seer, ean, reap, routing_kl, delta_h, MAEP global and uniform, AIMER, magnitude,
router_norm, router sensitivity, anti-REAP) on the text MoE testbed and the multimodal MoE testbed,
the per-layer rho of delta_h against the ground-truth KL, cross-dataset ranking stability, MWOP at
the paper's operating points against the same null of random masks on the dense multimodal testbed (and after a
recovery epoch, against the dense model and 3 random plans given the same recovery), and includes the
benchmark figures of scripts/collect_benchmarks.py when given. Every paper's claim is then judged over the seeds
by one rule (lightprune.quality.claims).

    python scripts/quality_table.py                      # full presets, 3 testbed seeds, a null of 50 random plans:
                                                         # ~1 h per seed the first time on 2 cores
    python scripts/quality_table.py --micro --out /tmp/r # the micro presets, 2 seeds, 8 random plans: what the test runs
    python scripts/quality_table.py --parts text mllm --benchmarks docs/results/benchmarks.json
    python scripts/quality_table.py --from-json docs/results/results.json   # re-render only
Parts not measured in a run keep their figures from <out>/results/results.json unless --fresh. Each testbed seed's
tables are kept in <out>/results/seeds/ as soon as they are measured: a run stopped after some seeds starts again
from the next one (the same settings; --fresh measures every seed again).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm.auto import tqdm

from lightprune.core.jsonio import read_json

PARTS = ("text", "mllm", "mwop")


class SeedTables:
    """One testbed seed's measured tables per file (``<part>-seed<n>.json``, with the settings they were measured
    under), written as soon as they are measured, so a long run that stops resumes at the next seed. A file whose
    settings differ from the run's, or whose testbed was trained from another spec than the run's (a preset whose
    recipe changed since), is measured again."""

    def __init__(self, folder: Path, fresh: bool = False) -> None:
        self.folder, self.fresh = folder, fresh

    def _path(self, part: str, settings: dict) -> Path:
        return self.folder / f"{part}-seed{settings['testbed_seed']}.json"

    def get(self, part: str, settings: dict, spec=None) -> dict | None:
        """The kept tables of ``settings``' seed, if measured under ``settings`` on a testbed of the digest of
        ``spec`` (a testbed spec; None: not compared), read from the spec the kept tables record."""
        path = self._path(part, settings)
        if self.fresh or not path.is_file():
            return None
        kept = read_json(path, "kept tables")
        if kept["settings"] != settings:
            differ = {k: (kept["settings"].get(k), settings.get(k)) for k in sorted({*kept["settings"], *settings})
                      if kept["settings"].get(k) != settings.get(k)}
            return self._stale(path, "measured under other settings: " + ", ".join(
                f"{k} {old!r} there, {new!r} in this run" for k, (old, new) in differ.items()))
        if spec is not None:
            try:
                recorded = type(spec)(**kept["tables"]["testbed"]["spec"])
            except (KeyError, TypeError, ValueError):  # no spec recorded, or one of another shape
                return self._stale(path, "it records no testbed spec this run can read")
            if recorded.digest() != spec.digest():
                return self._stale(path, f"its testbed was trained from another spec (digest {recorded.digest()}, "
                                         f"this run's {spec.digest()})")
        return kept["tables"]

    @staticmethod
    def _stale(path: Path, why: str) -> None:
        """Say (stderr) that the kept file at ``path`` is not used and why: the seed is measured again."""
        print(f"{path}: not used, {why}; this seed is measured again (its testbed trained if not cached)",
              file=sys.stderr)
        return None

    def put(self, part: str, settings: dict, tables: dict) -> dict:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self._path(part, settings)
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps({"settings": settings, "tables": tables}, default=float))
        temporary.replace(path)
        return read_json(path, "kept tables")["tables"]  # as a resumed run reads it: one code path after


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs", help="folder of RESULTS.md (PNGs and JSON go to <out>/results)")
    parser.add_argument("--root", default=None, help="testbed cache root")
    parser.add_argument("--micro", action="store_true", help="micro testbeds and sizes (seconds; for tests)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--ratios", nargs="+", type=float, default=[0.25, 0.5])
    parser.add_argument("--random-seeds", type=int, default=None,
                        help="random plans per ratio: the null each criterion is judged against (default 50; micro 8)")
    parser.add_argument("--testbed-seeds", type=int, nargs="+", default=None,
                        help="independently trained testbeds of each recipe (default 0 1 2; micro 0 1)")
    parser.add_argument("--benchmarks", help="JSON written by scripts/collect_benchmarks.py")
    parser.add_argument("--from-json", help="re-render a results.json without measuring")
    parser.add_argument("--fresh", action="store_true",
                        help="drop the parts measured before (default: keep <out>/results/results.json's other parts)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    from lightprune.quality.results_page import write_results

    command = "python scripts/quality_table.py" + (" --micro" if args.micro else "")
    if args.from_json:
        data = read_json(args.from_json, "results")
        if args.benchmarks:
            data["benchmarks"] = read_json(args.benchmarks, "benchmarks")
        path = write_results(args.out, **data, command=command)
        print(f"wrote {path}")
        return path
    progress = not args.no_progress
    micro = args.micro
    random_seeds = args.random_seeds or (8 if micro else 50)
    testbed_seeds = args.testbed_seeds or ([0, 1] if micro else [0, 1, 2])
    bar = tqdm(total=len(testbed_seeds) * len(args.parts), desc="testbed seeds", disable=not progress)
    seeded: dict[str, list] = {"text": [], "mllm": [], "mwop": []}
    parts = {}
    previous = Path(args.out) / "results" / "results.json"
    if previous.is_file() and not args.fresh:  # measure some parts, keep the others
        parts = {k: v for k, v in read_json(previous, "results").items() if v is not None}
    kept = SeedTables(Path(args.out) / "results" / "seeds", fresh=args.fresh)

    def measure_seed(part: str, settings: dict, measure) -> dict:
        """The seed's tables: kept, or measured and kept; a testbed the rows cannot be measured on (e.g. a dense
        model that scores zero on every task) gives ``{"error", "testbed_seed"}``, on the page, not kept."""
        from lightprune.quality.tables import testbed_spec

        found = kept.get(part, settings, testbed_spec(part, settings["preset"], settings["testbed_seed"]))
        if found is not None:
            return found
        try:
            return kept.put(part, settings, measure())
        except ValueError as err:
            print(f"{part}, testbed seed {settings['testbed_seed']}: not measured: {err}", file=sys.stderr)
            return {"error": str(err), "testbed_seed": settings["testbed_seed"]}

    for seed in testbed_seeds:  # each seed a testbed trained (once, then cached) from that seed
        if "text" in args.parts:
            from lightprune.quality.tables import text_tables

            sizes = dict(calibration_rows=8, eval_rows=8, kl_rows=8, sensitivity_steps=3, sensitivity_fits=2) \
                if micro else {}
            settings = dict(preset="micro" if micro else "full", ratios=list(args.ratios),
                            random_seeds=random_seeds, testbed_seed=seed, **sizes)
            seeded["text"].append(measure_seed("text", settings, lambda: text_tables(
                settings["preset"], args.root, ratios=tuple(args.ratios), random_seeds=random_seeds,
                progress=progress, testbed_seed=seed, **sizes)))
            bar.update(1)
        if "mllm" in args.parts:
            from lightprune.quality.tables import mllm_tables

            sizes = dict(kl_rows=8, sensitivity_steps=3, alpha_resamples=50) if micro else {}
            settings = dict(preset="mllm-moe-canvas-micro" if micro else "mllm-moe-canvas-full",
                            ratios=list(args.ratios),
                            random_seeds=random_seeds, testbed_seed=seed, **sizes)
            seeded["mllm"].append(measure_seed("mllm", settings, lambda: mllm_tables(
                settings["preset"], args.root, ratios=tuple(args.ratios), random_seeds=random_seeds,
                progress=progress, testbed_seed=seed, **sizes)))
            bar.update(1)
        if "mwop" in args.parts:
            from lightprune.quality.tables import mwop_tables

            settings = dict(preset="dense-mllm-micro" if micro else "dense-mllm-full", random_seeds=random_seeds,
                            testbed_seed=seed)
            seeded["mwop"].append(measure_seed("mwop", settings, lambda: mwop_tables(
                settings["preset"], args.root, random_seeds=random_seeds, progress=progress, testbed_seed=seed)))
            bar.update(1)
    bar.close()
    for part, tables in seeded.items():
        shown = [t for t in tables if "error" not in t]
        if shown:
            parts[part] = shown[0]  # the page's tables: the first measured seed's
    measured = {part for part, tables in seeded.items() if tables}
    if measured:  # the checks of the testbeds measured now; the others' as they were
        from lightprune.quality.claims import claims_over_seeds, criteria_over_seeds

        enough = 2 if micro else 3  # testbed seeds a verdict needs (the micro run: what the test can afford)
        fresh = claims_over_seeds(seeded["text"], seeded["mllm"], ratio=max(args.ratios), mwop=seeded["mwop"],
                                  min_seeds=enough)
        judged = (("text", "ppl"), ("mllm", "acc_image"), ("mllm", "ppl_image"), ("mllm", "ppl_text"))
        context = [c for part, metric in judged
                   for c in criteria_over_seeds(seeded[part], part, metric, ratio=max(args.ratios),
                                                min_seeds=enough)]
        parts["criteria"] = context + [c for c in parts.get("criteria") or [] if c["testbed"] not in measured]
        before = {c["testbed"] for c in parts.get("claims") or []} - measured
        parts["claims"] = [c for c in fresh if c["testbed"] not in before] + \
            [c for c in parts.get("claims") or [] if c["testbed"] in before]  # "not measured" where never measured
        if seeded["mllm"]:  # MAEP's alpha on every multimodal seed, with its interval
            from lightprune.quality.maep_section import maep_seed_record

            parts["maep"] = [maep_seed_record(t) for t in seeded["mllm"] if "error" not in t]
    if args.benchmarks:
        parts["benchmarks"] = read_json(args.benchmarks, "benchmarks")
    path = write_results(args.out, **parts, command=command)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()

"""Calibration overhead: collect_expert_stats (every criterion, subsets all + text) against a plain forward
over the same batches, side by side in one run, at four router shapes.

Shapes (issue 17): hidden 128, expert width 64, 2 layers, 2 batches of 4 x 256 tokens, built from transformers'
own configs (nothing downloaded): Mixtral-like (8 experts, top-2), OLMoE-like (64, top-8), Qwen3-30B-like
(128, top-8), DeepSeek-V3-like (256, top-8, 8 groups, 4 chosen). Target: ratio <= 1.5 for every shape, every
criterion on (``delta_h_promoted`` included; ``--criteria default`` leaves it out). Two baselines: the plain forward
as a user calls it (``model(**batch)``: logits at every position) and the headless forward (``logits_to_keep=1``,
as collect_expert_stats runs it: no criterion reads the logits); the ratio to the headless forward is the cost of
observing alone, and the target applies to both. One torch thread unless ``--threads``. ``bench_model`` is the
scaled-down Qwen3-MoE that scripts/gpu_check.py times.

    python scripts/bench_calibration.py [--repeats 5] [--processes 3] [--shapes mixtral,olmoe,qwen3,deepseek]
        [--criteria all|default] [--quick] [--json PATH]

``--processes N``: measure in N fresh processes one after the other and report, per shape, the median of their
ratios (each the ratio of minimum times over the repeats in one process) with the lowest and highest: the ratio
of one process moves by about 0.2 from process to process on a 2-core machine (allocator and cache state).
``--quick``: 1 batch of 2 x 64 tokens, 2 repeats, 1 process (seconds; checks the script, not the target).
``--json PATH``: the printed figures (times, ratios, target, PASS/FAIL, shapes, torch threads) as JSON.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_figures import check, write_json  # noqa: E402  (scripts/ is on sys.path when a script runs)

import lightprune as lp
from lightprune.core.jsonio import read_json
from lightprune.models import find_moe_layers


def seeded_model(config) -> torch.nn.Module:
    """A causal LM of ``config``, fp32, eval, seed 0, router rows drawn from N(0, 0.5^2) so routing is decisive."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in find_moe_layers(model):
            layer.router_linear.weight.normal_(0, 0.5)
    return model


def bench_model(layers: int = 4) -> torch.nn.Module:
    """The scaled-down Qwen3-MoE that scripts/gpu_check.py times (hidden 256, 16 experts, top-4)."""
    from transformers import Qwen3MoeConfig

    return seeded_model(Qwen3MoeConfig(vocab_size=4096, hidden_size=256, num_hidden_layers=layers,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                       intermediate_size=512, moe_intermediate_size=128, num_experts=16,
                                       num_experts_per_tok=4, norm_topk_prob=True, max_position_embeddings=1024,
                                       decoder_sparse_step=1, mlp_only_layers=[]))


_SHAPES = {"mixtral": ("Mixtral-like", 8, 2), "olmoe": ("OLMoE-like", 64, 8), "qwen3": ("Qwen3-30B-like", 128, 8),
           "deepseek": ("DeepSeek-V3-like", 256, 8)}


def shape_model(shape: str) -> torch.nn.Module:
    """The benchmark model of ``shape``: hidden 128, expert width 64, 2 MoE layers, fp32, eval, seeded."""
    from transformers import DeepseekV3Config, MixtralConfig, OlmoeConfig, Qwen3MoeConfig

    _, experts, top_k = _SHAPES[shape]
    common = dict(vocab_size=4096, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=1024, num_experts_per_tok=top_k, tie_word_embeddings=False)
    if shape == "mixtral":
        config = MixtralConfig(**common, intermediate_size=64, num_local_experts=experts)
    elif shape == "olmoe":
        config = OlmoeConfig(**common, intermediate_size=64, num_experts=experts, norm_topk_prob=False,
                             pad_token_id=0, bos_token_id=1, eos_token_id=2)
    elif shape == "qwen3":
        config = Qwen3MoeConfig(**common, head_dim=32, intermediate_size=256, moe_intermediate_size=64,
                                num_experts=experts, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    else:
        config = DeepseekV3Config(**{**common, "num_key_value_heads": 4}, intermediate_size=256,
                                  moe_intermediate_size=64, n_routed_experts=experts, n_shared_experts=1, n_group=8,
                                  topk_group=4, first_k_dense_replace=0, routed_scaling_factor=2.5,
                                  norm_topk_prob=True, q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=16,
                                  qk_nope_head_dim=16, v_head_dim=32)
    return seeded_model(config)


def shape_batches(count: int, rows: int, seq: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [{"input_ids": torch.randint(0, 4096, (rows, seq), generator=gen),
             "attention_mask": torch.ones(rows, seq, dtype=torch.long)} for _ in range(count)]


def plain(model, batches, **head):
    with torch.no_grad():
        for batch in batches:
            model(**batch, **head)


def collect(model, batches, criteria=None):
    lp.collect_expert_stats(model, batches, subsets=("all", "text"), criteria=criteria, progress=False)


def _measure(shapes: list[str], criteria, repeats: int, count: int, rows: int,
             seq: int) -> tuple[dict[str, dict], dict[str, dict]]:
    """In this process: per shape the minimum times over ``repeats`` interleaved runs and their ratios."""
    batches = shape_batches(count, rows, seq)
    table, times_s = {}, {}
    for shape in shapes:
        label, experts, top_k = _SHAPES[shape]
        model = shape_model(shape)
        run = {"plain": lambda: plain(model, batches), "headless": lambda: plain(model, batches, logits_to_keep=1),
               "collect": lambda: collect(model, batches, criteria)}
        plain(model, batches[:1])
        collect(model, batches[:1], criteria)
        times = {name: [] for name in run}
        for _ in range(repeats):  # interleaved: both see the same machine state
            for name, fn in run.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        best = {name: min(t) for name, t in times.items()}
        table[shape] = {"label": label, "experts": experts, "top_k": top_k, "plain_s": best["plain"],
                        "headless_s": best["headless"], "ratio_headless": best["collect"] / best["headless"],
                        "collect_s": best["collect"], "ratio": best["collect"] / best["plain"]}
        for name, t in times.items():
            times_s[f"{label} {name}"] = {"median": statistics.median(t), "min": min(t)}
    return table, times_s


def _one_process(argv: list[str], index: int) -> dict:
    """This script's figures from a fresh process (``--processes 1``, the other arguments as given)."""
    keep, skip = [], False
    for arg in argv:  # drop --processes / --json and their values
        if skip:
            skip = False
        elif arg in ("--processes", "--json"):
            skip = True
        elif not arg.startswith(("--processes=", "--json=")):
            keep.append(arg)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        done = subprocess.run([sys.executable, __file__, *keep, "--processes", "1", "--json", str(out)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"measuring process {index + 1} failed (exit {done.returncode}):\n"
                               f"{done.stderr[-2000:]}")
        return read_json(out, "measurements")


def _median_of(shape: str, rows: list[dict]) -> dict:
    """One shape's figures over processes: the median of each time and ratio, with every process's ratios."""
    first = rows[0]
    merged = {key: first[key] for key in ("label", "experts", "top_k")}
    for key in ("plain_s", "headless_s", "collect_s", "ratio", "ratio_headless"):
        merged[key] = statistics.median(row[key] for row in rows)
    merged["ratio_runs"] = [row["ratio"] for row in rows]
    merged["ratio_headless_runs"] = [row["ratio_headless"] for row in rows]
    return merged


def main(argv: list[str] | None = None) -> int:
    from lightprune.experts.calibration import CRITERIA, DEFAULT_CRITERIA

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None, help="default 5 (quick 2)")
    parser.add_argument("--shapes", default=",".join(_SHAPES), help=f"comma-separated, of {list(_SHAPES)}")
    parser.add_argument("--criteria", choices=("all", "default"), default="all",
                        help="all: every criterion (delta_h_promoted too); default: collect_expert_stats' default")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--processes", type=int, default=None, help="fresh processes to measure in (default 3, "
                        "quick 1); the figures are the median of their ratios")
    parser.add_argument("--target", type=float, default=1.5)
    parser.add_argument("--quick", action="store_true", help="small sizes and repeats: checks the script in seconds")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in _SHAPES]
    if unknown or not shapes:
        parser.error(f"--shapes: unknown {unknown or shapes}; choose from {list(_SHAPES)}")
    criteria = CRITERIA if args.criteria == "all" else DEFAULT_CRITERIA
    repeats = args.repeats or (2 if args.quick else 5)
    processes = args.processes or (1 if args.quick else 3)
    torch.set_num_threads(args.threads)
    count, rows, seq = (1, 2, 64) if args.quick else (2, 4, 256)
    print(f"collect_expert_stats ({args.criteria} criteria, all + text) / plain forward; hidden 128, expert width "
          f"64, 2 layers, {count} x {rows} x {seq} tokens; torch threads {torch.get_num_threads()}; min of {repeats}"
          + (f"; median of {processes} processes [lowest, highest]" if processes > 1 else ""))
    print(f"  {'shape':18s} {'experts':>7s} {'top-k':>5s} {'plain s':>8s} {'headless s':>10s} {'collect s':>9s} "
          f"{'ratio':>6s} {'/ headless':>10s}")
    if processes > 1:
        runs = [_one_process(sys.argv[1:] if argv is None else argv, index) for index in range(processes)]
        table = {shape: _median_of(shape, [run["by_shape"][shape] for run in runs]) for shape in shapes}
        times_s = {name: {"median": statistics.median(run["times_s"][name]["min"] for run in runs),
                          "min": min(run["times_s"][name]["min"] for run in runs)} for name in runs[0]["times_s"]}
    else:
        table, times_s = _measure(shapes, criteria, repeats, count, rows, seq)
    checks = []
    for shape, row in table.items():
        def spread(key: str) -> str:
            runs = row.get(key + "_runs")
            return f" [{min(runs):.2f}, {max(runs):.2f}]" if runs else ""

        print(f"  {row['label']:18s} {row['experts']:7d} {row['top_k']:5d} {row['plain_s']:8.3f} "
              f"{row['headless_s']:10.3f} {row['collect_s']:9.3f} {row['ratio']:6.2f}{spread('ratio')} "
              f"{row['ratio_headless']:10.2f}{spread('ratio_headless')}")
        how = "median of processes" if processes > 1 else "min"
        checks.append(check(f"collect_expert_stats / plain forward, {row['label']} ({how})", row["ratio"],
                            args.target, "<="))
        checks.append(check(f"collect_expert_stats / headless forward, {row['label']} ({how})",
                            row["ratio_headless"], args.target, "<="))
    passed = all(c["passed"] for c in checks)
    print("quick run: figures check the script, not the target" if args.quick else
          f"{'PASS' if passed else 'FAIL'}: every ratio (to both baselines) <= {args.target}")
    if args.json is not None:
        figures = {"benchmark": "calibration", "title": "Calibration overhead by router shape",
                   "what": " ".join(__doc__.split("\n\n")[0].split()), "quick": args.quick,
                   "torch_threads": torch.get_num_threads(), "torch_version": torch.__version__,
                   "repeats": repeats, "processes": processes, "criteria": list(criteria),
                   "shapes": {"hidden": 128, "expert_width": 64, "layers": 2, "batches": count, "rows": rows,
                              "seq": seq, "routers": ", ".join(f"{v[0]} {v[1]}/{v[2]}" for v in _SHAPES.values())},
                   "by_shape": table, "times_s": times_s, "checks": checks, "passed": passed}
        write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

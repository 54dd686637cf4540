#!/usr/bin/env python
"""Benchmark: AIMER weight scoring against one plain read of the same expert weights.

Builds a randomly initialised Qwen3-MoE causal LM (transformers ``Qwen3MoeConfig`` +
``AutoModelForCausalLM.from_config``, nothing downloaded) with at least ``--min-expert-params``
routed-expert parameters, then times, interleaved in one run (median of ``--repeats``):

  aimer      ``lp.score_weights(model, "aimer")`` on the real model object
  abs_sum    ``t.abs().sum()`` over every fused expert tensor (materialises ``|t|`` first)
  sum        ``t.sum()``: a pure streaming read, the memory-bandwidth floor (for reference)
  l1_norm    ``torch.linalg.vector_norm(t, 1)``: sum of abs fused into one read of every weight
  paper_alg1 the per-expert loop of the AIMER paper's Algorithm 1 (for reference)

and prints the expert parameter count, the times, the ratios aimer / baseline and PASS when
aimer / ``--baseline`` (default ``l1_norm``, the strictest sum-of-abs read) <= ``--target`` (default 2.0). It also checks a few
experts' AIMER against a float64 reference. Defaults: 2 layers x 64 experts, hidden 1024,
expert width 512 (201M expert parameters, ~0.9 GB fp32), well under two minutes on 2 cores.

    python scripts/bench_weight_scores.py [--layers 2 --experts 64 --hidden 1024 --moe-intermediate 512]

``--quick``: 1 layer x 8 experts, hidden 256, width 128, 3 repeats, no parameter floor (seconds; checks
the script, not the target). ``--json PATH``: the printed figures (times, ratios, target, PASS/FAIL,
shapes, torch threads) as JSON.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from bench_figures import check, write_json  # noqa: E402  (scripts/ is on sys.path when a script runs)

__all__ = ["build_model", "main"]

BASELINES = ("abs_sum", "sum", "l1_norm")


def build_model(layers: int, experts: int, hidden: int, moe_intermediate: int, dtype: torch.dtype, seed: int):
    """A Qwen3-MoE causal LM with small attention/vocab and random, per-expert-scaled expert weights."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    heads = max(1, hidden // 128)
    config = Qwen3MoeConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                            num_key_value_heads=heads, head_dim=hidden // heads, intermediate_size=moe_intermediate,
                            moe_intermediate_size=moe_intermediate, num_experts=experts, num_experts_per_tok=8,
                            vocab_size=1024, max_position_embeddings=256, decoder_sparse_step=1, mlp_only_layers=[],
                            tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "experts" in name and param.dim() == 3:
                # per expert: a random scale and a random mix of Gaussian and heavy-tailed entries
                for e in range(param.shape[0]):
                    scale = 0.01 + 0.04 * torch.rand((), generator=gen).item()
                    param[e].normal_(0.0, scale, generator=gen)
                    if e % 3 == 0:
                        param[e].mul_(torch.rand(param[e].shape, generator=gen, dtype=param.dtype).add_(0.5).square_())
    return model


def expert_tensors(model) -> list[torch.Tensor]:
    import lightprune as lp

    return [getattr(layer.experts, n) for layer in lp.find_moe_layers(model) for n in ("gate_up_proj", "down_proj")]


def read_abs_sum(tensors):
    return [t.abs().sum() for t in tensors]


def read_sum(tensors):
    return [t.sum() for t in tensors]


def read_l1_norm(tensors):
    return [torch.linalg.vector_norm(t, 1) for t in tensors]


def paper_alg1(model):
    """Algorithm 1 of the AIMER paper: per expert, abs().sum() and square().sum() of gate, up, down."""
    import lightprune as lp

    out = {}
    for layer in lp.find_moe_layers(model):
        scores = []
        for e in range(layer.num_experts):
            gate_up, down = layer.experts.gate_up_proj[e], layer.experts.down_proj[e]
            abs_sum = gate_up.abs().sum() + down.abs().sum()
            l2_sq = gate_up.square().sum() + down.square().sum()
            numel = gate_up.numel() + down.numel()
            scores.append((abs_sum / numel) / torch.sqrt(l2_sq / numel))
        out[layer.index] = torch.stack(scores)
    return out


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def reference_aimer(layer, e: int) -> float:
    w = torch.cat([layer.experts.gate_up_proj[e].double().flatten(), layer.experts.down_proj[e].double().flatten()])
    return (w.abs().sum() / (math.sqrt(w.numel()) * w.norm())).item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--layers", type=int, default=None, help="default 2 (quick 1)")
    parser.add_argument("--experts", type=int, default=None, help="default 64 (quick 8)")
    parser.add_argument("--hidden", type=int, default=None, help="default 1024 (quick 256)")
    parser.add_argument("--moe-intermediate", type=int, default=None, help="default 512 (quick 128)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--repeats", type=int, default=None, help="default 7 (quick 3)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--baseline", choices=BASELINES, default="l1_norm", help="the read-once pass PASS is judged on")
    parser.add_argument("--target", type=float, default=2.0, help="PASS when aimer / baseline <= target")
    parser.add_argument("--min-expert-params", type=float, default=None, help="default 100e6 (quick 0)")
    parser.add_argument("--skip-paper-alg1", action="store_true", help="skip the per-expert reference loop")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="small sizes and repeats: checks the script in seconds")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    for name, full, quick in (("layers", 2, 1), ("experts", 64, 8), ("hidden", 1024, 256),
                              ("moe_intermediate", 512, 128), ("repeats", 7, 3), ("min_expert_params", 100e6, 0.0)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.threads:
        torch.set_num_threads(args.threads)

    import lightprune as lp

    t0 = time.perf_counter()
    model = build_model(args.layers, args.experts, args.hidden, args.moe_intermediate, getattr(torch, args.dtype),
                        args.seed)
    tensors = expert_tensors(model)
    n_params = sum(t.numel() for t in tensors)
    print(f"model: Qwen3-MoE, {args.layers} MoE layers x {args.experts} experts, hidden {args.hidden}, "
          f"expert width {args.moe_intermediate}, {args.dtype}; built in {time.perf_counter() - t0:.1f} s")
    print(f"expert parameters: {n_params:,} ({n_params * tensors[0].element_size() / 2**30:.2f} GiB); "
          f"torch threads: {torch.get_num_threads()}")
    figures = {"benchmark": "weight_scores", "title": "AIMER weight scoring",
               "what": " ".join(__doc__.split("\n\n")[0].split()), "quick": args.quick,
               "torch_threads": torch.get_num_threads(), "torch_version": torch.__version__, "repeats": args.repeats,
               "shapes": {"model": "qwen3_moe", "layers": args.layers, "experts": args.experts, "hidden": args.hidden,
                          "moe_intermediate": args.moe_intermediate, "dtype": args.dtype, "expert_params": n_params},
               "times_s": {}, "checks": [], "passed": None}
    if n_params < args.min_expert_params:
        print(f"FAIL: fewer than {args.min_expert_params:,.0f} expert parameters; enlarge the model")
        figures["checks"].append(check("expert parameters", n_params, args.min_expert_params, ">="))
        figures["passed"] = False
        write_json(args.json, figures)
        return 2

    scores = lp.score_weights(model, "aimer")  # warm-up, and the correctness spot check
    layer = lp.find_moe_layers(model)[-1]
    worst = max(abs(scores.raw[layer.index][e].item() - reference_aimer(layer, e)) / reference_aimer(layer, e)
                for e in (0, 1, layer.num_experts - 1))
    print(f"AIMER spot check against float64: max relative error {worst:.2e}")
    figures["checks"].append(check("AIMER max relative error vs float64 (3 experts)", worst))
    passes = {"aimer": lambda: lp.score_weights(model, "aimer"), "abs_sum": lambda: read_abs_sum(tensors),
              "sum": lambda: read_sum(tensors), "l1_norm": lambda: read_l1_norm(tensors)}
    if not args.skip_paper_alg1:
        passes["paper_alg1"] = lambda: paper_alg1(model)
    times: dict[str, list[float]] = {name: [] for name in passes}
    with torch.no_grad():
        for fn in passes.values():
            fn()
        for _ in range(args.repeats):  # interleaved, so drift hits every pass alike
            for name, fn in passes.items():
                times[name].append(timed(fn))
    med = {name: statistics.median(v) for name, v in times.items()}
    best = {name: min(v) for name, v in times.items()}

    gbytes = n_params * tensors[0].element_size() / 1e9
    print(f"\n{args.repeats} repetitions, interleaved:   median        (min)")
    for name, value in med.items():
        print(f"  {name:<11} {value * 1e3:9.1f} ms ({best[name] * 1e3:7.1f} ms)   {gbytes / value:6.1f} GB/s of expert "
              "weights (median)")
    print("\nratios aimer / pass (medians; mins in brackets):")
    for name in med:
        if name != "aimer":
            print(f"  aimer / {name:<11} {med['aimer'] / med[name]:6.2f}  ({best['aimer'] / best[name]:.2f})")
    ratio = med["aimer"] / med[args.baseline]
    verdict = "PASS" if ratio <= args.target else "FAIL"
    print(f"\n{verdict}: aimer / {args.baseline} = {ratio:.2f} (target <= {args.target})")
    figures["times_s"] = {name: {"median": med[name], "min": best[name]} for name in med}
    figures["checks"][:0] = [check(f"aimer / {args.baseline} (median)", ratio, args.target, "<=")] + [
        check(f"aimer / {name} (median)", med["aimer"] / med[name], note=f"min {best['aimer'] / best[name]:.2f}")
        for name in med if name not in ("aimer", args.baseline)]
    figures["passed"] = verdict == "PASS"
    write_json(args.json, figures)
    return 0 if verdict == "PASS" else 1






if __name__ == "__main__":
    sys.exit(main())

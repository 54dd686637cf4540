"""The validations of MAEP ("Modality-Aware Expert Pruning for MoE-Based Multimodal Large Language Models", arXiv
2611.05927) as a command (appendix I and the ranking-stability check of appendix G).

1. Ground truth: on n calibration samples, the LM-head KL caused by removing each expert of each
   MoE layer alone, and the per-layer Spearman rho of delta_h, reap and routing_kl against it.
2. Ranking stability (with --second): per-layer Spearman between the delta_h rankings from two
   calibration sets, per token subset.

Writes <out>/validation.json and <out>/proxy_rho.png.

    python scripts/validate_proxies.py --checkpoint CKPT --tokenizer CKPT --calibration a.jsonl \
        [--second b.jsonl] [--samples 32] [--subsets all text] --out outputs/validation
    python scripts/validate_proxies.py --tiny qwen3_moe --out outputs/validation   # synthetic tokens
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import lightprune as lp
from lightprune.experts.calibration.validation import (
    ground_truth_kl,
    plot_correlations,
    proxy_correlations,
    ranking_stability,
)


def _model(args):
    if args.tiny:
        from lightprune.testing.tiny import tiny_model

        return tiny_model(args.tiny, seed=args.seed)
    return lp.load_pruned(args.checkpoint)


def _batches(args, path: str | None, seed: int) -> list[dict]:
    if path is None:
        from lightprune.data import SyntheticTokens

        dm = SyntheticTokens(num_samples=args.samples, seq_len=32, batch_size=args.batch_size, seed=seed)
        return list(dm.calibration_dataloader())
    if args.processor:
        from lightprune.data import ImageTextJsonlDataModule

        dm = ImageTextJsonlDataModule(args.processor, calibration=path, batch_size=args.batch_size,
                                      num_samples=args.samples)
    else:
        from lightprune.data import TextJsonlDataModule

        dm = TextJsonlDataModule(args.tokenizer, calibration=path, batch_size=args.batch_size,
                                 num_samples=args.samples, max_length=args.max_length)
    dm.setup("calibrate")
    return [{k: v for k, v in b.items() if k != "labels"} for b in dm.calibration_dataloader()]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="local checkpoint directory")
    source.add_argument("--tiny", help="a tiny random model of this family (synthetic data unless --calibration)")
    parser.add_argument("--tokenizer", help="local tokenizer directory (text JSONL)")
    parser.add_argument("--processor", help="local processor directory (image+text JSONL)")
    parser.add_argument("--calibration", help="calibration JSONL (default with --tiny: synthetic tokens)")
    parser.add_argument("--second", help="a second calibration JSONL for ranking stability")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--subsets", nargs="+", default=["all"])
    parser.add_argument("--expert-chunk", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="outputs/validation")
    args = parser.parse_args(argv)
    if args.calibration and not (args.tokenizer or args.processor):
        parser.error("--calibration needs --tokenizer (text JSONL) or --processor (image+text JSONL)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = _model(args).eval()
    batches = _batches(args, args.calibration, args.seed)
    stats = lp.collect_expert_stats(model, batches, subsets=args.subsets)
    truth = ground_truth_kl(model, batches, subsets=args.subsets, expert_chunk=args.expert_chunk)
    report = {"samples": stats.samples, "proxy_rho": proxy_correlations(stats, truth),
              "ground_truth_kl": {s: {str(l): v.tolist() for l, v in truth.raw("kl", s).items()} for s in truth.subsets}}
    if args.second or (args.tiny and not args.calibration):
        second = _batches(args, args.second, args.seed + 1)
        stats_b = lp.collect_expert_stats(model, second, subsets=args.subsets)
        report["ranking_stability"] = {c: ranking_stability(stats, stats_b, c) for c in ("delta_h", "reap")}
    (out / "validation.json").write_text(json.dumps(report, indent=1) + "\n")
    plot_correlations(report["proxy_rho"], out / "proxy_rho.png")
    for subset, proxies in report["proxy_rho"].items():
        means = ", ".join(f"{p} {r['mean']:.3f}" for p, r in proxies.items() if r["mean"] is not None)
        print(f"mean per-layer Spearman vs LM-head KL ({subset} tokens): {means}")
    for criterion, per_subset in report.get("ranking_stability", {}).items():
        means = ", ".join(f"{s} {r['mean']:.3f}" for s, r in per_subset.items() if r["mean"] is not None)
        print(f"ranking stability of {criterion} across calibration sets: {means}")
    print(f"wrote {out / 'validation.json'} and {out / 'proxy_rho.png'}")
    return report


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()

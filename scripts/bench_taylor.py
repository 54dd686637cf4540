"""Taylor importance cost: ``lp.taylor_importance`` (attention paths + FFN channels) against a plain forward +
backward of the same model and batches, time and peak memory, at several sequence lengths.

Model: a dense Qwen2 causal LM built from a config (nothing downloaded; hidden 512, 2 layers, 8 heads, 4 kv
heads, FFN 1408, vocab 4096, fp32, sdpa attention) whose config names an image token id, so width masking
tells vision from text tokens. Each sample: 16 system-free text tokens, then ``T / 2`` image tokens, then
text; the answer (labels) is the last 32 tokens. Batch 2 at every length.

Modes, each in its own subprocess (peak RSS of that process, and the peak RSS above the RSS once the model and
batches are built: the activation memory):

- ``fwd_bwd``: ``model(**batch)``, the answer cross-entropy, ``loss.backward()`` (parameter gradients), the
  reference;
- ``taylor``: ``taylor_importance(model, batches, attention=True, ffn=True)``, no plan (the first stage);
- ``taylor_plan`` (printed, no target): the same with a plan that prunes half of the heads' V2V paths and a
  quarter of their T2V paths (a later stage; the pruned paths are masked during the pass).

Time: median of ``--repeats`` runs after one warm-up, in the mode's process. Targets (issue 17, hidden 512):
taylor / fwd_bwd time <= 1.5 at 512 tokens and <= 2.0 at 2048 tokens; peak activation memory <= 2x that of
fwd_bwd at every length. One torch thread unless ``--threads``.

    python scripts/bench_taylor.py [--lengths 512,2048] [--repeats 3] [--threads 1] [--quick] [--json PATH]

``--quick``: hidden 128, lengths 128, one repeat (seconds; checks the script, not the target).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_figures import check, write_json  # noqa: E402  (scripts/ is on sys.path when a script runs)

__all__ = ["build_model", "batches", "main"]

IMAGE_TOKEN = 4000
TIME_TARGETS = {512: 1.5, 2048: 2.0}
MEMORY_TARGET = 2.0
MODES = ("fwd_bwd", "taylor", "taylor_plan")


def build_model(hidden: int):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    heads = 8 if hidden >= 256 else 4
    config = Qwen2Config(hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads,
                         num_key_value_heads=heads // 2, intermediate_size=int(hidden * 2.75), vocab_size=4096,
                         max_position_embeddings=4096, tie_word_embeddings=False)
    config.image_token_id = IMAGE_TOKEN
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


def batches(length: int, count: int = 2, batch_size: int = 2, answer: int = 32):
    """``count`` batches of ``batch_size`` x ``length`` tokens: text, ``length / 2`` image tokens, text."""
    import torch

    out = []
    gen = torch.Generator().manual_seed(length)
    for _ in range(count):
        ids = torch.randint(0, 3000, (batch_size, length), generator=gen)
        ids[:, 16:16 + length // 2] = IMAGE_TOKEN
        labels = torch.full_like(ids, -100)
        labels[:, -answer:] = ids[:, -answer:]
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    return out


def _plan(model):
    import torch

    import lightprune as lp

    plan = lp.WidthPlan.dense(model)
    for layer, heads in plan.num_heads.items():
        keep = plan.attn_keep[layer].clone()
        keep[: heads // 2, 0] = False
        keep[: heads // 4, 1] = False
        plan.attn_keep[layer] = keep
    assert not all(bool(k.all()) for k in plan.attn_keep.values())
    torch.manual_seed(0)
    return plan


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_mode(mode: str, hidden: int, length: int, repeats: int, threads: int) -> dict:
    """One mode in this process: median seconds over the batches and peak memory (MiB)."""
    import torch
    import torch.nn.functional as F

    from lightprune.width.taylor import taylor_importance  # imported before the setup RSS is read

    torch.set_num_threads(threads)
    model = build_model(hidden)
    data = batches(length)
    plan = _plan(model) if mode == "taylor_plan" else None

    def once():
        if mode == "fwd_bwd":
            for batch in data:
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
                target = batch["labels"][:, 1:]
                loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), target.flatten(), ignore_index=-100)
                loss.backward()
                model.zero_grad(set_to_none=True)
        else:
            taylor_importance(model, data, attention=True, ffn=True, plan=plan, progress=False)

    setup = _rss_mib()
    once()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        once()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": statistics.median(times), "min_seconds": min(times), "peak_rss_mib": peak,
            "activation_mib": peak - setup}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,2048")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--mode", choices=MODES, default=None, help=argparse.SUPPRESS)  # one mode, this process
    args = parser.parse_args(argv)
    if args.quick:
        args.hidden, args.lengths, args.repeats = 128, "128", 1
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.mode is not None:
        print(json.dumps(run_mode(args.mode, args.hidden, lengths[0], args.repeats, args.threads)))
        return 0

    results: dict[int, dict[str, dict]] = {}
    for length in lengths:
        results[length] = {}
        for mode in MODES:
            cmd = [sys.executable, __file__, "--mode", mode, "--lengths", str(length), "--hidden", str(args.hidden),
                   "--repeats", str(args.repeats), "--threads", str(args.threads)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode:
                sys.stderr.write(done.stderr)
                raise SystemExit(f"bench_taylor: mode {mode} at {length} tokens failed (exit {done.returncode})")
            results[length][mode] = json.loads(done.stdout.strip().splitlines()[-1])

    print(f"Taylor importance / forward+backward, hidden {args.hidden}, batch 2 x 2 batches, "
          f"{args.threads} thread(s), median of {args.repeats}")
    print(f"{'tokens':>7} {'fwd+bwd s':>10} {'taylor s':>9} {'ratio':>6} {'plan s':>7} {'ratio':>6} "
          f"{'fwd+bwd MiB':>12} {'taylor MiB':>11} {'ratio':>6} {'plan MiB':>9}  (activation MiB = peak - setup RSS)")
    figures = []
    for length, r in results.items():
        base, tay, planned = r["fwd_bwd"], r["taylor"], r["taylor_plan"]
        time_ratio = tay["seconds"] / base["seconds"]
        plan_ratio = planned["seconds"] / base["seconds"]
        mem_ratio = tay["activation_mib"] / max(base["activation_mib"], 1.0)
        print(f"{length:>7} {base['seconds']:>10.3f} {tay['seconds']:>9.3f} {time_ratio:>6.2f} "
              f"{planned['seconds']:>7.3f} {plan_ratio:>6.2f} {base['activation_mib']:>12.0f} "
              f"{tay['activation_mib']:>11.0f} {mem_ratio:>6.2f} {planned['activation_mib']:>9.0f}")
        target = None if args.quick else TIME_TARGETS.get(length)
        memory_target = None if args.quick else MEMORY_TARGET
        figures.append(check(f"taylor / forward+backward time, {length} tokens (median)", round(time_ratio, 3), target,
                             "<=" if target else None, reference=round(base["seconds"], 4),
                             reference_name="forward+backward s"))
        figures.append(check(f"taylor with a plan / forward+backward time, {length} tokens (median)",
                             round(plan_ratio, 3), reference=round(base["seconds"], 4),
                             reference_name="forward+backward s",
                             note="half the V2V, a quarter of the T2V paths pruned"))
        figures.append(check(f"taylor / forward+backward activation memory, {length} tokens", round(mem_ratio, 3),
                             memory_target, "<=" if memory_target else None, reference=round(base["activation_mib"], 1),
                             reference_name="forward+backward MiB", note="peak RSS above the RSS after setup, "
                                                                         "each mode in its own process"))
    verdict = [f for f in figures if f["passed"] is not None]
    failed = [f["name"] for f in verdict if not f["passed"]]
    if args.quick:
        print("--quick: not judged (the targets are for hidden 512 at 512 and 2048 tokens)")
    else:
        print("targets: " + ("PASS" if not failed else f"FAIL ({', '.join(failed)})"))
    write_json(args.json, {
        "benchmark": "taylor", "title": "Taylor importance cost by sequence length",
        "what": " ".join(__doc__.split("\n\n")[0].split()), "quick": args.quick, "torch_threads": args.threads,
        "repeats": args.repeats, "shapes": {"hidden": args.hidden, "layers": 2, "batch": 2, "batches": 2,
                                            "lengths": ", ".join(map(str, lengths))},
        "checks": figures, "passed": None if not verdict else not failed,
        "times_s": {f"{length} {mode}": {"median": r[mode]["seconds"], "min": r[mode]["min_seconds"]}
                    for length, r in results.items() for mode in MODES}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

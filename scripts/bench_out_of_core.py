"""Out of core: peak memory and time of the streamed paths (scores + ``prune_checkpoint``, sequential calibration)
against the in-memory ones on a checkpoint of Qwen3-30B-A3B's expert shape, side by side in one run.

The checkpoint is generated here, never downloaded: a Qwen3-MoE config with Qwen3-30B-A3B's layer shapes (hidden
2048, 128 experts of width 768, top-8, 32 query / 4 key-value heads of 128) and ``--layers`` decoder layers (default
6: 7.6 GB; one layer is 1.26 GB, so the memory a streamed path needs, one layer plus activations, is a fraction of
the checkpoint that falls with the layer count: 48 in Qwen3-30B-A3B), a small vocabulary (8192), bf16 values drawn from a seeded generator, written as transformers'
per-expert keys in shards of at most 512 MB (one tensor at a time, with lightprune's streaming writer).

Each path runs in its own process; its peak resident memory is that process's ``ru_maxrss`` (``os.wait4``):

- stream prune: ``lp.score_weights(path, "aimer")``, ``lp.select_experts(ratio=0.5)``, ``lp.prune_checkpoint``
  (verification included: block by block and a layer-by-layer forward);
- memory prune: ``from_pretrained``, the same scores and plan, ``lp.export_pruned`` (prune, save, reload, verify);
- stream / memory calibration: ``lp.collect_expert_stats`` (default criteria, subsets all + text) on the same
  ``--batches`` batches of 2 x 128 token ids, from the directory or from the loaded model.

Printed: wall time, peak RSS, peak RSS / checkpoint bytes, time against the in-memory path, and whether the results
are identical (the two pruned checkpoints tensor by tensor, the two sets of statistics value by value). Target
(issue 18): peak RSS / checkpoint bytes <= 0.4 for both streamed paths, results identical.

    python scripts/bench_out_of_core.py [--layers 6] [--batches 4] [--work-dir DIR] [--keep] [--quick] [--json PATH]

``--quick``: hidden 256, 16 experts of width 128, 4 layers (about 26 MB; seconds: checks the script, the memory
ratio is printed, not judged). ``--work-dir``: where the checkpoint and outputs go (default a temporary directory
under the system's, removed after unless ``--keep``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from bench_figures import check, write_json  # noqa: E402  (scripts/ is on sys.path when a script runs)

__all__ = ["write_checkpoint", "main"]

SHAPES = {"full": dict(hidden_size=2048, num_experts=128, moe_intermediate_size=768, num_attention_heads=32,
                       num_key_value_heads=4, head_dim=128, intermediate_size=6144, vocab_size=8192),
          "quick": dict(hidden_size=256, num_experts=16, moe_intermediate_size=128, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=64, intermediate_size=512, vocab_size=1024)}
SHARD_BYTES = 512 * 1024 * 1024


def _config(layers: int, quick: bool):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(**SHAPES["quick" if quick else "full"], num_hidden_layers=layers, num_experts_per_tok=8,
                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                          max_position_embeddings=4096, tie_word_embeddings=False, dtype="bfloat16")


def _disk_tensors(config) -> list[tuple[str, tuple[int, ...]]]:
    """(key, shape) of the checkpoint as transformers writes Qwen3-MoE: the model's tensors with each fused expert
    tensor as one tensor per expert."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    out = []
    for name, tensor in model.state_dict().items():
        if name.endswith("experts.gate_up_proj"):
            experts, rows, cols = tensor.shape
            base = name.removesuffix("gate_up_proj")
            for e in range(experts):
                out += [(f"{base}{e}.gate_proj.weight", (rows // 2, cols)), (f"{base}{e}.up_proj.weight", (rows // 2, cols))]
        elif name.endswith("experts.down_proj"):
            base = name.removesuffix("down_proj")
            out += [(f"{base}{e}.down_proj.weight", tuple(tensor.shape[1:])) for e in range(tensor.shape[0])]
        else:
            out.append((name, tuple(tensor.shape)))
    return out


def write_checkpoint(path: Path, layers: int, quick: bool, seed: int = 0) -> int:
    """Generate the benchmark checkpoint at ``path`` (see the module docstring); returns its tensor bytes."""
    from lightprune.checkpoints.writer import SafetensorsWriter

    config = _config(layers, quick)
    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(path)
    tensors, shards, current, size = _disk_tensors(config), [], [], 0
    for key, shape in tensors:
        nbytes = 2 * int(torch.Size(shape).numel())
        if current and size + nbytes > SHARD_BYTES:
            shards.append(current)
            current, size = [], 0
        current.append((key, shape))
        size += nbytes
    shards.append(current)
    gen = torch.Generator().manual_seed(seed)
    weight_map, total = {}, 0
    for number, shard in enumerate(shards, start=1):
        name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        with SafetensorsWriter(path / name, [(k, torch.bfloat16, s) for k, s in shard]) as writer:
            for key, shape in shard:
                if key.endswith("norm.weight"):
                    value = torch.ones(shape, dtype=torch.bfloat16)
                else:
                    value = (torch.randn(shape, generator=gen) * (0.5 if key.endswith("mlp.gate.weight") else 0.02))
                    value = value.to(torch.bfloat16)
                writer.write(key, value)
                weight_map[key] = name
                total += value.numel() * 2
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    return total


# ------------------------------------------------------------------ the measured runs, each in its own process
_RUNS = {
    "stream_prune": """
import lightprune as lp
scores = lp.score_weights(PATH, "aimer", progress=False)
plan = lp.select_experts(scores, ratio=0.5)
plan.save(OUT + ".plan.json")
lp.prune_checkpoint(PATH, plan, OUT, progress=False)
""",
    "memory_prune": """
import torch
import lightprune as lp
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(PATH, dtype=torch.bfloat16).eval()
scores = lp.score_weights(model, "aimer")
plan = lp.select_experts(scores, ratio=0.5)
plan.save(OUT + ".plan.json")
lp.export_pruned(model, plan, OUT)
""",
    "stream_calibrate": """
import torch
import lightprune as lp
stats = lp.collect_expert_stats(PATH, BATCHES, subsets=("all", "text"), progress=False)
torch.save({(c, u): dict(stats.raw(c, u)) for c in stats.criteria for u in stats.subsets}, OUT + ".pt")
""",
    "memory_calibrate": """
import torch
import lightprune as lp
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(PATH, dtype=torch.bfloat16).eval()
stats = lp.collect_expert_stats(model, BATCHES, subsets=("all", "text"), progress=False)
torch.save({(c, u): dict(stats.raw(c, u)) for c in stats.criteria for u in stats.subsets}, OUT + ".pt")
""",
}


def _run(name: str, path: Path, out: Path, batches: int, vocab: int) -> dict:
    prelude = (f"import torch\nPATH, OUT = {str(path)!r}, {str(out)!r}\n"
               f"gen = torch.Generator().manual_seed(1)\n"
               f"BATCHES = [{{'input_ids': torch.randint(3, {vocab}, (2, 128), generator=gen)}} "
               f"for _ in range({batches})]\n")
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", prelude + _RUNS[name]], stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    stderr = process.stderr.read()
    process.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{name} failed:\n{stderr[-4000:]}")
    return {"wall_s": wall, "peak_rss_bytes": usage.ru_maxrss * 1024}


def _same_checkpoints(a: Path, b: Path) -> bool:
    from lightprune.checkpoints import Checkpoint

    with Checkpoint(a) as left, Checkpoint(b) as right:
        if sorted(left.keys()) != sorted(right.keys()):
            return False
        return all(torch.equal(left.tensor(k), right.tensor(k)) for k in left.keys())


def _same_stats(a: Path, b: Path) -> bool:
    left, right = torch.load(a), torch.load(b)
    return left.keys() == right.keys() and all(
        left[k].keys() == right[k].keys() and all(torch.equal(left[k][i], right[k][i]) for i in left[k]) for k in left)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the generated checkpoint and the outputs")
    parser.add_argument("--target", type=float, default=0.4)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH")
    args = parser.parse_args(argv)
    if args.layers < 1 or args.batches < 1:
        parser.error(f"--layers and --batches must be >= 1, got {args.layers} and {args.batches}")
    work = Path(tempfile.mkdtemp(prefix="lightprune-ooc-", dir=args.work_dir))
    try:
        path = work / "checkpoint"
        start = time.perf_counter()
        size = write_checkpoint(path, args.layers, args.quick)
        print(f"checkpoint: Qwen3-MoE, {args.layers} layers of {SHAPES['quick' if args.quick else 'full']}, bf16, "
              f"{size / 1e9:.2f} GB in {len(list(path.glob('*.safetensors')))} shards "
              f"(written in {time.perf_counter() - start:.0f} s); one decoder layer is {1 / args.layers:.0%} of it")
        vocab = SHAPES["quick" if args.quick else "full"]["vocab_size"]
        runs = {name: _run(name, path, work / name, args.batches, vocab) for name in _RUNS}
        same_prune = _same_checkpoints(work / "stream_prune", work / "memory_prune") and \
            json.loads((work / "stream_prune.plan.json").read_text())["keep"] == \
            json.loads((work / "memory_prune.plan.json").read_text())["keep"]
        same_stats = _same_stats(work / "stream_calibrate.pt", work / "memory_calibrate.pt")
        print(f"  {'path':18s} {'wall s':>8s} {'peak RSS GB':>12s} {'RSS / ckpt':>11s}")
        for name, run in runs.items():
            print(f"  {name:18s} {run['wall_s']:8.1f} {run['peak_rss_bytes'] / 1e9:12.2f} "
                  f"{run['peak_rss_bytes'] / size:11.3f}")
        prune_time = runs["stream_prune"]["wall_s"] / runs["memory_prune"]["wall_s"]
        calib_time = runs["stream_calibrate"]["wall_s"] / runs["memory_calibrate"]["wall_s"]
        print(f"  time, streamed / in memory: prune {prune_time:.2f}, calibration {calib_time:.2f}")
        print(f"  identical results: pruned checkpoints {same_prune}, calibration statistics {same_stats}")
        checks = [check(f"{kind} peak RSS / checkpoint bytes", runs[f"stream_{kind}"]["peak_rss_bytes"] / size,
                        None if args.quick else args.target, None if args.quick else "<=",
                        reference=runs[f"memory_{kind}"]["peak_rss_bytes"] / size,
                        reference_name="in memory") for kind in ("prune", "calibrate")]
        checks += [check("pruned checkpoints identical", same_prune, True, "=="),
                   check("calibration statistics identical", same_stats, True, "=="),
                   check("prune time, streamed / in memory", prune_time),
                   check("calibration time, streamed / in memory", calib_time)]
        passed = all(c["passed"] is not False for c in checks)
        print("quick run: the memory ratio checks the script, not the target" if args.quick else
              f"{'PASS' if passed else 'FAIL'}: streamed peak RSS <= {args.target} of the checkpoint, results identical")
        if args.json is not None:
            write_json(args.json, {
                "benchmark": "out_of_core", "title": "Out-of-core scoring, pruning and calibration",
                "what": " ".join(__doc__.split("\n\n")[0].split()), "quick": args.quick,
                "checkpoint": {"layers": args.layers, "bytes": size, **SHAPES["quick" if args.quick else "full"]},
                "batches": args.batches, "runs": runs, "checks": checks, "passed": passed,
                "torch_version": torch.__version__})
        return 0 if passed or args.quick else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


if __name__ == "__main__":
    raise SystemExit(main())

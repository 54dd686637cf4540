"""Export: time of ``lp.export_pruned`` (prune by a plan, save, reload, verify) and checkpoint bytes on disk
against the expected size, side by side with a plain ``save_pretrained`` of the unpruned model in one run.

Model: a Qwen3-MoE causal LM built from a config (``lightprune.testing.tiny.tiny_config("qwen3_moe", ...)`` +
``AutoModelForCausalLM.from_config``, nothing downloaded; default hidden 1024, 8 layers, 32 experts, expert
width 512, vocab 32000, fp32: 0.49B parameters, 2 GB), router weights redrawn so that routing is decisive.
Plan: AIMER scores (``lp.score_weights(model, "aimer")``), half of the experts of every layer pruned
(``lp.select_experts(imp, ratio=0.5)``). After one untimed warm-up of both, each repeat (default 5) exports a
fresh copy of the model (the copy is not timed), interleaved with the plain save, the order alternating.

Expected bytes: the sum over the pruned model's state dict (each tensor once) of numel x element size,
counted here, independently of the export's own manifest. Targets: checkpoint bytes / expected bytes <= 1.01
(the safetensors header is the only overhead), the tensor data on disk exactly the expected bytes, and
export time / ``save_pretrained`` time of the unpruned model <= 1.5 (medians; the export prunes, saves the
pruned model, reloads it with transformers and compares the logits on one probe). Also printed: pruned /
unpruned checkpoint bytes next to the expected fraction.

    python scripts/bench_export.py [--repeats 5] [--quick] [--work-dir /dev/shm] [--out-dir DIR] [--json PATH]

``--quick``: hidden 64, 2 layers, 8 experts, width 64, vocab 512, one repeat (seconds; the byte targets hold,
the time ratio is printed, not judged). Timings on a disk include its write-back; ``--work-dir`` on a tmpfs
leaves it out of both.
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from bench_figures import check, write_json  # noqa: E402  (scripts/ is on sys.path when a script runs)

__all__ = ["build_model", "expected_bytes", "safetensors_bytes", "main"]

#: (default, quick) model sizes
SIZES = {"hidden": (1024, 64), "layers": (8, 2), "experts": (32, 8), "moe_intermediate": (512, 64),
         "vocab": (32000, 512)}


def build_model(hidden: int, layers: int, experts: int, moe_intermediate: int, vocab: int, seed: int = 0):
    """A Qwen3-MoE causal LM from ``tiny_config("qwen3_moe", ...)``, fp32, eval, router weights redrawn."""
    from transformers import AutoModelForCausalLM

    from lightprune.models import find_moe_layers
    from lightprune.testing.tiny import tiny_config

    heads = max(2, hidden // 64)
    config = tiny_config("qwen3_moe", hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=max(1, heads // 2), head_dim=hidden // heads,
                         intermediate_size=2 * moe_intermediate, moe_intermediate_size=moe_intermediate,
                         num_experts=experts, num_experts_per_tok=min(4, experts), vocab_size=vocab,
                         max_position_embeddings=1024)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in find_moe_layers(model):
            layer.router.weight.copy_(torch.randn(layer.router.weight.shape, generator=gen) * 0.5)
    return model


def expected_bytes(model: torch.nn.Module) -> int:
    """Sum of numel x element size over ``model.state_dict()``, a tensor shared by several keys counted once."""
    seen, total = set(), 0
    for tensor in model.state_dict().values():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.dtype)
        if key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total


def safetensors_bytes(directory: Path) -> dict[str, int]:
    """Bytes on disk of the ``*.safetensors`` files under ``directory``: ``total``, ``header`` (the 8-byte
    length and the JSON header of every file) and ``data`` (the rest: tensor bytes)."""
    total = header = 0
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors file in {directory}")
    for file in files:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
        total += size
        header += 8 + length
    return {"total": total, "header": header, "data": total - header, "files": len(files)}




def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    for name, (full, quick) in SIZES.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None,
                            help=f"default {full} (quick {quick})")
    parser.add_argument("--ratio", type=float, default=0.5, help="fraction of each layer's experts pruned")
    parser.add_argument("--repeats", type=int, default=None, help="timed exports (default 3, quick 1)")
    parser.add_argument("--target", type=float, default=1.01, help="PASS when checkpoint / expected bytes <= target")
    parser.add_argument("--time-target", type=float, default=1.5,
                        help="PASS when export_pruned / save_pretrained (unpruned) <= this (judged without --quick)")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="where the timed checkpoints are written (default: a temp dir; a tmpfs such as /dev/shm "
                             "takes the disk's write-back out of both timings)")
    parser.add_argument("--quick", action="store_true", help="small model, one repeat: checks the script in seconds")
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="keep the last exported checkpoint here (replaced if it exists; default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    for name, (full, quick) in SIZES.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    args.repeats = args.repeats or (1 if args.quick else 5)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")

    import lightprune as lp

    t0 = time.perf_counter()
    original = build_model(args.hidden, args.layers, args.experts, args.moe_intermediate, args.vocab, args.seed)
    imp = lp.score_weights(original, "aimer")
    plan = lp.select_experts(imp, ratio=args.ratio)
    unpruned_expected = expected_bytes(original)
    print(f"model: Qwen3-MoE, {args.layers} layers x {args.experts} experts, hidden {args.hidden}, expert width "
          f"{args.moe_intermediate}, vocab {args.vocab}, fp32; built and scored in {time.perf_counter() - t0:.1f} s; "
          f"torch threads {torch.get_num_threads()}")
    print(f"plan: AIMER, ratio {args.ratio}: kept per layer "
          f"{ {layer: len(ids) for layer, ids in sorted(plan.keep.items())} }")

    times: dict[str, list[float]] = {"export_pruned": [], "save_pretrained (unpruned)": []}
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench_export_", dir=args.work_dir) as work:
        work = Path(work)
        # warm-up, not timed: lazy imports and first-call costs of both paths
        lp.export_pruned(copy.deepcopy(original), plan, work / "warmup_pruned")
        original.save_pretrained(work / "warmup_unpruned")
        for r in range(args.repeats):  # interleaved, the order alternating
            model = copy.deepcopy(original)
            out, plain = work / f"pruned_{r}", work / f"unpruned_{r}"
            steps = [("export_pruned", lambda: lp.export_pruned(model, plan, out)),
                     ("save_pretrained (unpruned)", lambda: original.save_pretrained(plain))]
            results = {}
            for name, fn in (steps if r % 2 == 0 else steps[::-1]):
                start = time.perf_counter()
                results[name] = fn()
                times[name].append(time.perf_counter() - start)
            report = results["export_pruned"]
            pruned_expected = expected_bytes(model)
            disk, disk_unpruned = safetensors_bytes(out), safetensors_bytes(plain)
            if r + 1 < args.repeats:
                shutil.rmtree(out)
                shutil.rmtree(plain)
        if args.out_dir is not None:
            if args.out_dir.exists():
                shutil.rmtree(args.out_dir)
            args.out_dir.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(out), str(args.out_dir))

    med = {name: statistics.median(t) for name, t in times.items()}
    best = {name: min(t) for name, t in times.items()}
    ratio = disk["total"] / pruned_expected
    fraction = pruned_expected / unpruned_expected
    print(f"{args.repeats} repeat(s), interleaved:        median   (min)")
    for name in times:
        print(f"  {name:<28} {med[name]:7.3f} s ({best[name]:.3f})")
    time_ratio = med["export_pruned"] / med["save_pretrained (unpruned)"]
    print(f"  export_pruned / save_pretrained (unpruned): {time_ratio:.2f} (medians; export also prunes, reloads and "
          "verifies)")
    print(f"checkpoint: {disk['total']:,} B in {disk['files']} safetensors file(s) = {disk['data']:,} B tensor data "
          f"+ {disk['header']:,} B headers")
    print(f"expected (pruned state dict, numel x element size): {pruned_expected:,} B; export manifest: "
          f"{report.parameter_bytes:,} B")
    print(f"unpruned: checkpoint {disk_unpruned['total']:,} B, expected {unpruned_expected:,} B; pruned / unpruned "
          f"checkpoint bytes {disk['total'] / disk_unpruned['total']:.4f} (expected fraction {fraction:.4f})")
    print(f"parameters {report.parameters_before:,} -> {report.parameters:,}; verification max |logits diff| "
          f"{report.max_abs_diff:.2e}")
    data_match = disk["data"] - pruned_expected
    print(f"{'PASS' if data_match == 0 else 'FAIL'}: tensor data on disk - expected bytes = {data_match} (target 0)")
    verdict = "PASS" if ratio <= args.target and data_match == 0 else "FAIL"
    print(f"{verdict}: checkpoint bytes / expected bytes = {ratio:.4f} (target <= {args.target})")
    time_passed = None if args.quick else time_ratio <= args.time_target
    if time_passed is None:
        print(f"(--quick: export / save time ratio {time_ratio:.2f} not judged; the target <= {args.time_target} is "
              f"for the ~0.5B default model)")
    else:
        print(f"{'PASS' if time_passed else 'FAIL'}: export_pruned / save_pretrained (unpruned) = {time_ratio:.2f} "
              f"(target <= {args.time_target}, medians)")
        verdict = verdict if time_passed else "FAIL"

    if args.json is not None:
        checks = [check("checkpoint bytes / expected bytes", ratio, args.target, "<=",
                        note=f"{disk['total']:,} B on disk, {pruned_expected:,} B expected, "
                             f"{disk['header']:,} B headers"),
                  check("tensor data bytes on disk - expected bytes", data_match, 0, "=="),
                  check("pruned / unpruned checkpoint bytes", disk["total"] / disk_unpruned["total"],
                        reference=fraction, reference_name="expected fraction"),
                  check("export_pruned / save_pretrained unpruned (median)", time_ratio,
                        None if args.quick else args.time_target, None if args.quick else "<=",
                        note=f"export {med['export_pruned']:.3f} s; prunes, saves, reloads and verifies"),
                  check("verification max |logits diff|", report.max_abs_diff)]
        figures = {"benchmark": "export", "title": "Export: time and checkpoint bytes",
                   "what": " ".join(__doc__.split("\n\n")[0].split()), "quick": args.quick,
                   "torch_threads": torch.get_num_threads(), "torch_version": torch.__version__,
                   "repeats": args.repeats,
                   "shapes": {"model": "qwen3_moe", **{name: getattr(args, name) for name in SIZES}, "dtype": "float32",
                              "ratio": args.ratio},
                   "times_s": {name: {"median": med[name], "min": best[name]} for name in times},
                   "bytes": {"checkpoint": disk["total"], "data": disk["data"], "header": disk["header"],
                             "files": disk["files"], "expected": pruned_expected,
                             "manifest_expected": report.parameter_bytes,
                             "unpruned_checkpoint": disk_unpruned["total"], "unpruned_expected": unpruned_expected},
                   "params": {"before": report.parameters_before, "after": report.parameters,
                              "kept_per_layer": {str(k): v for k, v in report.experts_per_layer.items()}},
                   "checks": checks, "passed": verdict == "PASS"}
        write_json(args.json, figures)
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())

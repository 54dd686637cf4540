"""The GPU paths of lightprune, one part per call, each printing its figures (run by scripts/gpu_check.sh).

Parts:

- ``env``: torch / CUDA / DeepSpeed / Triton versions and the device.
- ``calib``: calibration (every criterion) on a scaled-down Qwen3-MoE in fp32 and in bf16 on the
  GPU: tokens per second of each, and per criterion the per-layer Spearman rho of the bf16 scores
  against the fp32 ones (bf16 should keep the rankings: rho near 1).
- ``zero3``: a short full fine-tune on one GPU under DeepSpeed ZeRO-3 (bf16-mixed), then AIMER
  (gathered layer by layer), prune, export and verify on rank 0: seconds, peak GPU memory, the
  export's verification difference. Then the same with router LoRA + RouterDelta; each job's outcome is
  printed even when the other fails.
- ``prefill``: scripts/bench_prefill.py on the GPU (the paper's 7B shapes; ``--cpu-smoke``: ``--quick``).
- ``stream``: the streamed paths on the GPU (a checkpoint of Qwen3-30B-A3B's layer shape written here):
  streamed / in-memory calibration tokens/s, prune with verification / copy, calibration / plain forward, and
  extrapolated GPU-hours of a 235B and a 1T checkpoint's calibration.
- ``kernels``: when ``lightprune.width.kernels`` exists, its GPU tests (``pytest -m gpu``) compile and run
  the Triton kernels for real; otherwise it says that the module is absent.

``--cpu-smoke`` runs ``calib``, ``stream`` and ``zero3`` on the CPU (fp32 vs bf16 on CPU; ZeRO-3 through the
tests' CPU DeepSpeed strategy, one process) to check this script's own logic without a GPU.

    python scripts/gpu_check.py calib [--cpu-smoke]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from lightprune.core.jsonio import read_json

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["main"]


def _device(smoke: bool) -> torch.device:
    if smoke:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device (use --cpu-smoke to check the script on the CPU)")
    return torch.device("cuda")


def part_env(args) -> None:
    print(f"torch {torch.__version__}, CUDA available {torch.cuda.is_available()}, CUDA {torch.version.cuda}")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print(f"device: {p.name}, {p.total_memory / 2**30:.1f} GiB, capability {p.major}.{p.minor}, "
              f"bf16 {torch.cuda.is_bf16_supported()}")
    for name in ("deepspeed", "triton", "lightning", "transformers", "peft"):
        try:
            module = __import__(name)
            print(f"{name} {getattr(module, '__version__', '?')}")
        except Exception as err:  # report, keep going
            print(f"{name}: not importable ({type(err).__name__}: {err})")


def _model(layers: int, device: torch.device):
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_calibration import bench_model

    return bench_model(layers).to(device)


def part_calib(args) -> None:
    import lightprune as lp
    from lightprune.experts.ranking import spearman

    device = _device(args.cpu_smoke)
    batches_n, seq = (2, 64) if args.cpu_smoke else (16, 512)
    gen = torch.Generator().manual_seed(1)
    batches = [{"input_ids": torch.randint(0, 4096, (2, seq), generator=gen).to(device),
                "attention_mask": torch.ones(2, seq, dtype=torch.long, device=device)} for _ in range(batches_n)]
    tokens = batches_n * 2 * seq
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = _model(4, device).to(dtype)
        lp.collect_expert_stats(model, batches[:1], progress=False)  # warm-up (kernels, allocator)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        stats = lp.collect_expert_stats(model, batches, progress=False)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else float("nan")
        results[dtype] = stats
        print(f"calib {str(dtype).removeprefix('torch.')}: {tokens} tokens in {seconds:.3f} s "
              f"({tokens / seconds:,.0f} tok/s), peak {peak:.0f} MiB")
    fp32, bf16 = results[torch.float32], results[torch.bfloat16]
    for name in fp32.criteria:
        want, got = fp32.raw(name, "all"), bf16.raw(name, "all")
        rhos = [spearman(got[l].double().cpu(), want[l].double().cpu()) for l in want]
        print(f"calib bf16 vs fp32 {name}: Spearman rho per layer min {min(rhos):.3f} mean {sum(rhos) / len(rhos):.3f}")


def _zero3_job(args, run: Path, lora: bool) -> dict:
    import lightning.pytorch as pl

    from lightprune.callbacks import ExpertPruning, Export, RouterDelta
    from lightprune.cli.trainer import PruneTrainer
    from lightprune.core.distributed import outside_zero_init
    from lightprune.data import SyntheticTokens
    from lightprune.finetune import MoECausalLM

    class SeededLM(MoECausalLM):  # the tiny model's seeded weights survive zero.Init (see distributed.outside_zero_init)
        def configure_model(self) -> None:
            with outside_zero_init():
                super().configure_model()

    if args.cpu_smoke:
        sys.path.insert(0, str(ROOT / "tests"))
        from fixtures.cpu_deepspeed import CPUDeepSpeedStrategy

        strategy, accel, precision = CPUDeepSpeedStrategy(stage=3), "cpu", "32-true"
    else:
        from lightning.pytorch.strategies import DeepSpeedStrategy

        strategy, accel, precision = DeepSpeedStrategy(stage=3), "gpu", "bf16-mixed"
    overrides = {"num_hidden_layers": 4, "num_experts": 16, "hidden_size": 256, "moe_intermediate_size": 128,
                 "vocab_size": 1024}
    if lora:
        module = SeededLM(tiny="qwen3_moe", tiny_overrides=overrides, learning_rate=1e-2, scheduler="constant",
                          adapter={"kind": "lora", "targets": ["router"], "r": 8, "dropout": 0.0})
        callbacks = [RouterDelta(score="weight"), ExpertPruning("router_delta", ratio=0.5), Export(summary=False)]
    else:
        module = SeededLM(tiny="qwen3_moe", tiny_overrides=overrides, learning_rate=1e-4, scheduler="constant")
        # fp32 (CPU smoke) logits of a trained model reach ~10: masked vs pruned differ by ~1e-5 in rounding
        callbacks = [ExpertPruning("aimer", ratio=0.5), Export(summary=False, atol=1e-4 if args.cpu_smoke else None)]
    pl.seed_everything(0, verbose=False)
    trainer = PruneTrainer(accelerator=accel, devices=1, strategy=strategy, precision=precision, max_steps=10,
                           logger=False, enable_checkpointing=False, enable_progress_bar=False,
                           enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                           default_root_dir=str(run), callbacks=callbacks)
    if accel == "gpu":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    trainer.fit(module, datamodule=SyntheticTokens(num_samples=40, seq_len=128, batch_size=4, high=1000))
    seconds = time.perf_counter() - start
    report = read_json(run / "report.json", "report")
    peak = torch.cuda.max_memory_allocated() / 2**20 if accel == "gpu" else float("nan")
    return {"seconds": seconds, "peak_mib": peak, "max_abs_diff": report["max_abs_diff"],
            "params": (report["params_before"], report["params_after"]), "criterion": report["criterion"]}


def part_zero3(args) -> None:
    for lora in (False, True):
        what = "router LoRA + RouterDelta" if lora else "full fine-tune + AIMER + Export"
        try:
            with tempfile.TemporaryDirectory() as tmp:
                r = _zero3_job(args, Path(tmp), lora)
            print(f"zero3 {what}: fit+prune+export {r['seconds']:.1f} s, peak {r['peak_mib']:.0f} MiB, "
                  f"params {r['params'][0]:,} -> {r['params'][1]:,}, export max |dlogits| {r['max_abs_diff']:.2e}")
        except Exception as err:  # one failure must not hide the other figure
            lines = [line for line in str(err).splitlines() if line.strip()]
            print(f"zero3 {what}: FAILED {type(err).__name__}: {lines[-1][:300] if lines else ''}")


def part_kernels(args) -> None:
    try:
        import lightprune.width.kernels as kernels
    except ImportError as err:
        print(f"kernels: lightprune.width.kernels is absent ({err}); nothing to compile")
        return
    print(f"kernels: {kernels.__name__} found ({', '.join(getattr(kernels, '__all__', [])) or 'no __all__'})")
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", str(ROOT / "tests")]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    tail = "\n".join(done.stdout.strip().splitlines()[-15:])
    print(f"kernels: pytest -m gpu exit {done.returncode} in {time.perf_counter() - start:.1f} s\n{tail}")


def part_prefill(args) -> None:
    """MWOP prefill: scripts/bench_prefill.py on the GPU (7B shapes: every path attention and the cost model's choice
    vs dense SDPA, compact vs dense FFN)."""
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_prefill.py")]
    cmd += ["--quick", "--device", "cpu"] if args.cpu_smoke else ["--device", "cuda"]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    lines = [l for l in done.stdout.splitlines() if l.startswith(("ratio", "chosen", "note", "PASS", "FAIL"))]
    print(f"prefill: bench_prefill exit {done.returncode} in {time.perf_counter() - start:.1f} s")
    print("\n".join(lines) or done.stdout[-3000:] + done.stderr[-3000:])


#: the decoder layers and routed-expert shapes of the checkpoints extrapolated to: the measured seconds per token and
#: layer at Qwen3-30B-A3B's shape (top-8 of 128 experts of width 768, hidden 2048) scale with hidden x width (top-8
#: everywhere); a layer's read is assumed hidden by its compute, as the streamed / in-memory figure says it is
EXTRAPOLATED = {"Qwen3-235B-A22B": dict(layers=94, hidden=4096, width=1536, experts=128, top_k=8),
                "Kimi K2 (1T)": dict(layers=61, hidden=7168, width=2048, experts=384, top_k=8)}


def _timed(device: torch.device, call) -> tuple[float, object]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = call()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def part_stream(args) -> None:
    """Streamed paths on the device (issue 51): a checkpoint of Qwen3-30B-A3B's layer shape (6 layers, bf16, written
    here), streamed calibration tokens/s against in-memory calibration on the same device, streamed prune with
    verification against a copy, calibration (every criterion) against a plain forward, and the device-hours of a
    235B and a 1T checkpoint's calibration over 2M tokens extrapolated from the per-layer figures. ``--cpu-smoke``: the quick shape, 2 layers."""
    import shutil

    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_out_of_core import SHAPES, write_checkpoint
    from transformers import AutoModelForCausalLM

    import lightprune as lp
    from lightprune.experts.calibration import CRITERIA

    device = _device(args.cpu_smoke)
    shape, layers = ("quick", 2) if args.cpu_smoke else ("full", 6)
    # on the GPU enough tokens per pass that a layer's compute, not its read, sets the pace (262k)
    batches_n, seq = (2, 32) if args.cpu_smoke else (128, 1024)
    gen = torch.Generator().manual_seed(1)
    vocab = SHAPES[shape]["vocab_size"]
    batches = [{"input_ids": torch.randint(3, vocab, (2, seq), generator=gen)} for _ in range(batches_n)]
    tokens = batches_n * 2 * seq
    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        path = Path(tmp) / "checkpoint"
        seconds, size = _timed(device, lambda: write_checkpoint(path, layers, shape))
        print(f"stream: checkpoint {layers} layers of {shape} ({size / 1e9:.2f} GB) written in {seconds:.0f} s")
        lp.collect_expert_stats(path, batches[:1], progress=False, device=device)  # warm-up: imports, kernels
        streamed_s, streamed = _timed(device, lambda: lp.collect_expert_stats(
            path, batches, progress=False, device=device, batches_per_pass=batches_n))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
        inputs = [{k: v.to(device) for k, v in b.items()} for b in batches]
        lp.collect_expert_stats(model, inputs[:1], progress=False)
        memory_s, in_memory = _timed(device, lambda: lp.collect_expert_stats(model, inputs, progress=False))
        every_s, _ = _timed(device, lambda: lp.collect_expert_stats(model, inputs, criteria=CRITERIA,
                                                                    progress=False))

        def forward() -> None:
            with torch.no_grad():
                for batch in inputs:
                    model(**batch, logits_to_keep=1)
        forward()
        plain_s, _ = _timed(device, forward)
        worst = max(float(((streamed.raw(c, "all")[i].cpu() - in_memory.raw(c, "all")[i].cpu()).abs().max()
                           / in_memory.raw(c, "all")[i].abs().max().clamp_min(1e-30)).cpu())
                    for c in streamed.criteria for i in in_memory.raw(c, "all"))
        passes_s = streamed.metadata["seconds"]["passes"]
        print(f"stream: calibration {tokens} tokens: streamed {tokens / passes_s:,.0f} tok/s ({tokens / streamed_s:,.0f} "
              f"with the opening), in memory {tokens / memory_s:,.0f} tok/s, streamed / in memory (tok/s) "
              f"{memory_s / passes_s:.2f} (target >= 0.8); largest difference of the statistics {worst:.1e} of their "
              f"scale; activations {streamed.metadata['activations']}")
        print(f"stream: calibration, every criterion {every_s:.2f} s / plain forward {plain_s:.2f} s = "
              f"{every_s / plain_s:.2f} (target <= 1.3)")
        del model, inputs
        if device.type == "cuda":
            torch.cuda.empty_cache()
        plan = lp.select_experts(lp.score_weights(path, "aimer", progress=False, device=device), ratio=0.5)
        prune_s, _ = _timed(device, lambda: lp.prune_checkpoint(path, plan, Path(tmp) / "pruned", progress=False,
                                                                device=device))
        start = time.perf_counter()
        shutil.copytree(path, Path(tmp) / "copy")
        os.sync()
        copy_s = time.perf_counter() - start
        print(f"stream: prune with verification on {device} {prune_s:.1f} s / copy {copy_s:.1f} s = "
              f"{prune_s / copy_s:.2f} (target <= 1.0)")
    base = SHAPES["full"]
    per_token_layer = passes_s / layers / tokens  # seconds per token and layer at Qwen3-30B-A3B's shape
    for name, shape_of in EXTRAPOLATED.items():
        flops = shape_of["hidden"] * shape_of["width"] / (base["hidden_size"] * base["moe_intermediate_size"])
        hours = per_token_layer * flops * shape_of["layers"] * 2_000_000 / 3600
        print(f"stream: {name}: calibration over 2M tokens ~{hours:.2f} hours on {device} (the measured seconds "
              f"per token and layer x {flops:.1f} the expert FLOPs x {shape_of['layers']} layers)")


PARTS = {"env": part_env, "calib": part_calib, "zero3": part_zero3, "kernels": part_kernels,
         "prefill": part_prefill, "stream": part_stream}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=sorted(PARTS))
    parser.add_argument("--cpu-smoke", action="store_true", help="run on the CPU to check the script itself")
    parser.add_argument("--work-dir", default=None, help="where the stream part writes its checkpoint")
    args = parser.parse_args(argv)
    PARTS[args.part](args)


if __name__ == "__main__":
    main()

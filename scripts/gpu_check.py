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
- ``kernels``: when ``lightprune.width.kernels`` exists, its GPU tests (``pytest -m gpu``) compile and run
  the Triton kernels for real; otherwise it says that the module is absent.

``--cpu-smoke`` runs ``calib`` and ``zero3`` on the CPU (fp32 vs bf16 on CPU; ZeRO-3 through the
tests' CPU DeepSpeed strategy, one process) to check this script's own logic without a GPU.

    python scripts/gpu_check.py calib [--cpu-smoke]
"""

from __future__ import annotations

import argparse
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
    """MWOP prefill: scripts/bench_prefill.py on the GPU (7B shapes: Triton vs SDPA, compact vs dense FFN)."""
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_prefill.py")]
    cmd += ["--quick", "--device", "cpu"] if args.cpu_smoke else ["--device", "cuda"]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    lines = [l for l in done.stdout.splitlines() if l.startswith(("ratio", "note", "PASS", "FAIL"))]
    print(f"prefill: bench_prefill exit {done.returncode} in {time.perf_counter() - start:.1f} s")
    print("\n".join(lines) or done.stdout[-3000:] + done.stderr[-3000:])


PARTS = {"env": part_env, "calib": part_calib, "zero3": part_zero3, "kernels": part_kernels,
         "prefill": part_prefill}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=sorted(PARTS))
    parser.add_argument("--cpu-smoke", action="store_true", help="run on the CPU to check the script itself")
    args = parser.parse_args(argv)
    PARTS[args.part](args)


if __name__ == "__main__":
    main()

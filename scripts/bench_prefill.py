"""Dense vs MWOP-pruned prefill time, side by side in one run (MWOP ("MWOP: Modality-aware Width-wise Operation
Pruning for Efficient MLLMs"), appendix D.5 "Latency Evaluation").

Each comparison warms both sides up, then times them interleaved (the order alternates every repeat) and
prints ``pruned/dense`` as the ratio of medians and of minimums, next to the retained-FLOPs fraction of
:func:`lightprune.width.flops.decoder_flops` (appendix D.4: F_attn = 4 N d (d + d_kv) + 4 d a,
F_ffn = 6 d (V m~_V + T m), m~_V = min(m, b ceil(k_V / b))). Operating points (pruned fractions of
V2V / T2V / T2T head paths, visual FFN channels; text FFN dense): LLaVA-OneVision 40/60/10 + 50%,
Qwen2.5-VL 60/70/0 + 40%. Timed inputs add SYSTEM tokens before the visual span (the paper's 18 / 11 on
the GPU shapes, 8 on the CPU shapes); the FLOPs exclude them, as D.4 does. Token splits, BlockMasks and
interval tables depend only on the plan and the tokens (once per forward in a model), so they are built
before timing, as the paper packs weights and tunes kernels before timing; their build time is printed.

- CPU (always; ``--threads``, default 1: on shared cores multi-threaded GEMM times mostly measure the
  scheduler): scaled-down shapes. FFN: the transformers Qwen2 MLP vs :class:`CompactModalityFFN` with shared
  weights (target at 50% visual channels: at most 0.6x the dense time) and with packed copies beside. Attention
  core: dense causal SDPA (GQA) vs every candidate of the export's choice, masked SDPA, the ``span`` backend
  (fused SDPA on the kept key spans) and :func:`lightprune.width.kernels.flex_path_attention` under
  ``torch.compile`` (eager, said so, when compiling fails); then the cost model's choice
  (:func:`lightprune.width.kernels.attention_cost.choose_attention`) with its estimates, the measured ratios and
  the fastest measured; the attention fraction is the retained causal pairs.
  Total: a few Qwen2 decoder layers with the LM head on the last token, dense SDPA vs both swaps
  (:func:`swap_compact_ffn` and the flex path attention registered as an attention implementation reading the
  swap's token modality).
- GPU (when CUDA is available and ``--device`` allows): the paper's 7B per-layer shapes in bf16 with CUDA
  events (eager, no CUDA graphs): compact vs dense FFN (target <= 0.6 at LLaVA-OneVision's shape, <= 1.0 at
  Qwen2.5-VL's; the compact FFN as the export runs it, slices of the MLP's own permuted weights, and with packed
  copies beside); the Triton
  kernel (intervals prebuilt, and end to end; not a candidate), then the same candidates and choice as on the CPU,
  the choice judged: <= 0.75 of dense SDPA at LLaVA-OneVision's shape, <= 1.0 at Qwen2.5-VL's.

``--quick`` runs tiny shapes in seconds (a test runs it so the script cannot rot). ``--json PATH`` also writes
the printed figures (every ratio with its retained-FLOPs fraction, targets, PASS/FAIL, shapes, threads) as JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from bench_figures import write_json  # noqa: E402  (scripts/ is on sys.path when a script runs)

from lightprune.width.flops import decoder_flops
from lightprune.width.kernels.compact_ffn import CompactModalityFFN, split_tokens
from lightprune.width.kernels.path_attention import path_sparse_attention
from lightprune.width.paths import SYSTEM, TEXT, VISION
from lightprune.width.plan import WidthPlan
from lightprune.width.swap import swap_compact_ffn

__all__ = ["main"]

#: name -> (pruned fractions of v2v, t2v, t2t; pruned fraction of visual FFN channels; system tokens)
POINTS = {"llava_onevision": ((0.4, 0.6, 0.1), 0.5, 18), "qwen2_5_vl": ((0.6, 0.7, 0.0), 0.4, 11)}
#: the paper's (V, T) profiles of section D.4 for the 7B GPU shapes
PROFILES_7B = {"llava_onevision": (3215, 19), "qwen2_5_vl": (485, 38)}
FFN_CPU_TARGET = 0.6
#: on the GPU shapes, compact / dense FFN and the chosen path attention / dense causal SDPA (1.0 where not named)
FFN_GPU_TARGETS, ATTENTION_TARGETS = {"llava_onevision": 0.6}, {"llava_onevision": 0.75}
#: every figure :func:`report` printed in this run, for ``--json``
RESULTS: list[dict] = []


def shapes(quick: bool) -> dict:
    if quick:
        return dict(d=128, heads=4, kv=2, head_dim=32, m=512, V=96, T=8, layers=1, system=4)
    return dict(d=1024, heads=16, kv=2, head_dim=64, m=4096, V=1024, T=32, layers=2, system=8)


def qwen2_config(s: dict, layers: int | None = None):
    from transformers import Qwen2Config

    config = Qwen2Config(hidden_size=s["d"], num_attention_heads=s["heads"], num_key_value_heads=s["kv"],
                         head_dim=s["head_dim"], intermediate_size=s["m"], num_hidden_layers=layers or s["layers"],
                         vocab_size=1024, max_position_embeddings=8192, tie_word_embeddings=False)
    config.image_token_id = 1000
    return config


def plan_for(config, point: str, seed: int = 0, attention: bool = True, ffn: bool = True) -> WidthPlan:
    """Random masks at the operating point's pruned fractions (which heads / channels does not matter
    for time); the same masks in every layer."""
    (paths, vision, _), gen = POINTS[point], torch.Generator().manual_seed(seed)
    heads, m, layers = config.num_attention_heads, config.intermediate_size, config.num_hidden_layers
    attn = torch.ones(heads, 3, dtype=torch.bool)
    for col, frac in enumerate(paths):
        attn[torch.randperm(heads, generator=gen)[:round(frac * heads)], col] = False
    keep = torch.ones(m, dtype=torch.bool)
    keep[torch.randperm(m, generator=gen)[:round(vision * m)]] = False
    return WidthPlan(attn_keep={l: attn for l in range(layers)} if attention else {},
                     ffn_keep={l: {"vision": keep, "text": torch.ones(m, dtype=torch.bool)} for l in range(layers)}
                     if ffn else {},
                     num_heads={l: heads for l in range(layers)}, intermediate_size={l: m for l in range(layers)})


def modality_codes(system: int, V: int, T: int, device) -> torch.Tensor:
    codes = [SYSTEM] * system + [VISION] * V + [TEXT] * T
    return torch.tensor(codes, dtype=torch.int8, device=device)[None]


def timeit(fns: dict, repeats: int, warmup: int, device: torch.device) -> dict[str, list[float]]:
    """Seconds per call of each function: warm-up, then interleaved repeats (order alternating)."""
    cuda = device.type == "cuda"
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    if cuda:
        torch.cuda.synchronize(device)
    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fns[name]()
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fns[name]()
                times[name].append(time.perf_counter() - t0)
    return times


def report(kind: str, point: str, times: dict, fraction: float, target: float | None = None, note: str = "") -> None:
    dense, pruned = times["dense"], times["pruned"]
    med = statistics.median(pruned) / statistics.median(dense)
    low = min(pruned) / min(dense)
    verdict = "" if target is None else f"  target <= {target:.3f}  {'PASS' if med <= target else 'FAIL'}"
    print(f"ratio {kind:<9} {point:<16} pruned/dense median {med:.3f} min {low:.3f}  retained FLOPs "
          f"{fraction:.3f}  (dense median {statistics.median(dense) * 1e3:.2f} ms){verdict}{note}")
    details = (f"min {low:.3f}", f"dense median {statistics.median(dense) * 1e3:.2f} ms", note.strip())
    RESULTS.append({"name": f"{kind} {point} pruned/dense (median)", "value": med, "target": target,
                    "op": None if target is None else "<=", "passed": None if target is None else bool(med <= target),
                    "reference": fraction, "reference_name": "retained FLOPs",
                    "note": "; ".join(part for part in details if part),
                    "kind": kind, "point": point, "min": low, "dense_median_s": statistics.median(dense),
                    "pruned_median_s": statistics.median(pruned)})


class Flex:
    """FlexAttention path-sparse attention (:func:`lightprune.width.kernels.path_attention.flex_path_attention`)
    with one BlockMask per operating point built before timing (as the paper packs and tunes before timing);
    compiled with ``torch.compile`` unless ``--quick``, eager (said so) when compiling fails."""

    def __init__(self, quick: bool, where: str = "CPU"):
        from lightprune.width.kernels.path_attention import flex_path_attention, path_block_mask

        self.attend, self.build = flex_path_attention, path_block_mask
        self.compile = not quick
        self.checked = quick
        self.where = where
        self.masks: dict = {}

    @property
    def note(self) -> str:
        return " [flex compiled, BlockMask prebuilt]" if self.compile else " [flex eager, BlockMask prebuilt]"

    def block_mask(self, point: str, modality: torch.Tensor, keep: torch.Tensor, heads: int):
        key = (point, tuple(modality.shape))
        if key not in self.masks:
            t0 = time.perf_counter()
            self.masks[key] = self.build(modality, keep, heads)
            print(f"note: {point} BlockMask for {modality.shape[1]} tokens built in {time.perf_counter() - t0:.2f} s "
                  f"(not timed)")
        return self.masks[key]

    def __call__(self, q, k, v, modality, keep, block_mask, scale=None):
        if not self.checked:
            self.checked = True
            t0 = time.perf_counter()
            try:
                out = self.attend(q, k, v, modality, keep, scale=scale, block_mask=block_mask, compile=True)
                print(f"note: torch.compile of FlexAttention on {self.where}: compiled in "
                      f"{time.perf_counter() - t0:.1f} s")
                return out
            except Exception as err:  # noqa: BLE001 - reported; the brief asks to time eager then
                self.compile = False
                print(f"note: torch.compile of FlexAttention failed on {self.where} ({type(err).__name__}: "
                      f"{str(err).splitlines()[0][:160]}); timing eager FlexAttention")
        return self.attend(q, k, v, modality, keep, scale=scale, block_mask=block_mask, compile=self.compile)


# ---------------------------------------------------------------------------------------------- parts
def bench_ffn(s, point, args, device, dtype, target=None):
    """Qwen2 MLP vs CompactModalityFFN as an export runs it (slices of the MLP's own permuted weights, judged against
    ``target``), and with packed copies of the kept and other channels beside."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

    config = qwen2_config(s, layers=1)
    system = POINTS[point][2] if device.type == "cuda" else s["system"]
    mlp = Qwen2MLP(config).to(device=device, dtype=dtype).eval()
    plan = plan_for(config, point, attention=False)
    packed = CompactModalityFFN(mlp, plan.ffn_keep[0], align=args.align)  # before the shared one permutes the MLP
    compact = CompactModalityFFN(mlp, plan.ffn_keep[0], align=args.align, share_weights=True)
    x = torch.randn(1, system + s["V"] + s["T"], s["d"], device=device, dtype=dtype)
    mod = modality_codes(system, s["V"], s["T"], device)
    split = split_tokens(mod)  # once per forward in a model, shared by every layer: not timed
    fraction = decoder_flops(config, s["V"], s["T"], plan, args.align).ffn_fraction
    extra = sum(b.numel() * b.element_size() for b in packed.buffers()) / 2 ** 20
    for module, what, judged in ((compact, "shared weights", target),
                                 (packed, f"packed copies, {extra:.1f} MiB", None)):
        times = timeit({"dense": lambda: mlp(x), "pruned": lambda m=module: m(x, mod, split)}, args.repeats,
                       args.warmup, device)
        report("ffn", point, times, fraction, judged, f"  [visual channels {compact.kept['vision']}/{s['m']}, "
                                                      f"width {compact.width['vision']}, {what}]")
    compact.restore()


def attention_inputs(s, point, device, dtype, system):
    N = system + s["V"] + s["T"]
    q = torch.randn(1, s["heads"], N, s["head_dim"], device=device, dtype=dtype)
    k = torch.randn(1, s["kv"], N, s["head_dim"], device=device, dtype=dtype)
    v = torch.randn(1, s["kv"], N, s["head_dim"], device=device, dtype=dtype)
    return q, k, v, modality_codes(system, s["V"], s["T"], device)


def pairs_fraction(config, s, plan) -> float:
    layer = decoder_flops(config, s["V"], s["T"], plan, 64).per_layer[0]
    N = s["V"] + s["T"]
    return layer["pairs_per_head"] / (N * (N + 1) / 2)


def bench_attention(s, point, args, device, dtype, flex: Flex, target: float | None = None, triton: bool = False,
                    profile=None):
    """Every path-attention candidate against dense causal SDPA on one shape, then the cost model's choice
    (:func:`lightprune.width.kernels.attention_cost.choose_attention`) judged against ``target``: masked SDPA, the
    span decomposition, FlexAttention (BlockMask prebuilt), and on a GPU the Triton kernel (not a candidate)."""
    from lightprune.width.kernels.attention_cost import choose_attention

    config = qwen2_config(s, layers=1)
    plan = plan_for(config, point, ffn=False)
    q, k, v, mod = attention_inputs(s, point, device, dtype, s["system"])
    keep = plan.attn_keep[0].to(device)
    fraction = pairs_fraction(config, s, plan)
    dense = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
    measured = {}
    if triton:
        from lightprune.width.kernels.intervals import class_bits, key_intervals
        from lightprune.width.kernels.path_attention_triton import default_blocks, triton_path_attention

        intervals = key_intervals(mod, keep, q.shape[2], default_blocks(device, s["head_dim"])[0])
        bits = class_bits(keep)
        times = timeit({"dense": dense, "pruned": lambda: triton_path_attention(q, k, v, mod, keep,
                                                                                intervals=intervals, bits=bits)},
                       args.repeats, args.warmup, device)
        report("attention", point, times, fraction, None, "  [triton, intervals and class bits prebuilt]")
        times = timeit({"dense": dense, "pruned": lambda: path_sparse_attention(q, k, v, mod, keep, backend="triton")},
                       args.repeats, args.warmup, device)
        report("attention", point, times, fraction, None, "  [path_sparse_attention triton, intervals per call]")
    mask = flex.block_mask(point, mod, keep, s["heads"])
    flex(q, k, v, mod, keep, mask)  # compiles (or reports why not) before timing
    candidates = {"sdpa": (lambda: path_sparse_attention(q, k, v, mod, keep, backend="sdpa"), "masked SDPA"),
                  "span": (lambda: path_sparse_attention(q, k, v, mod, keep, backend="span"),
                           "SDPA on the kept key spans"),
                  "flex": (lambda: flex(q, k, v, mod, keep, mask), flex.note.strip(" []"))}
    for name, (fn, what) in candidates.items():
        times = timeit({"dense": dense, "pruned": fn}, args.repeats, args.warmup, device)
        measured[name] = statistics.median(times["pruned"]) / statistics.median(times["dense"])
        report("attention", point, times, fraction, None, f"  [{name}: {what}]")
    layout = [("system", s["system"]), ("vision", s["V"]), ("text", s["T"])]
    element = 4 if device.type == "cpu" else torch.finfo(dtype).bits // 8
    chosen, costs = choose_attention(layout, keep.cpu(), kv_heads=s["kv"], head_dim=s["head_dim"],
                                     element_bytes=element, device=device.type)
    fastest = min(measured, key=measured.__getitem__)
    ratio = measured[chosen]
    verdict = "" if target is None else f"  target <= {target:.3f}  {'PASS' if ratio <= target else 'FAIL'}"
    estimates = ", ".join(f"{n} {c * 1e3:.3f} ms" for n, c in costs.items())
    ratios = ", ".join(f"{n} {r:.3f}" for n, r in measured.items())
    print(f"chosen    attention {point:<16} {chosen} (estimated {estimates}); measured pruned/dense {ratios}; "
          f"fastest measured {fastest}{verdict}")
    if profile is not None:  # the same choice from the profile measured on this device
        mine, mine_costs = choose_attention(layout, keep.cpu(), kv_heads=s["kv"], head_dim=s["head_dim"],
                                            element_bytes=element, device=profile)
        print(f"chosen    attention {point:<16} with the measured profile: {mine} (estimated "
              f"{', '.join(f'{n} {c * 1e3:.3f} ms' for n, c in mine_costs.items())})")
    RESULTS.append({"name": f"attention {point} chosen kernel / dense SDPA (median)", "value": ratio, "target": target,
                    "op": None if target is None else "<=", "passed": None if target is None else bool(ratio <= target),
                    "reference": fraction, "reference_name": "retained causal pairs",
                    "note": f"chosen {chosen}, fastest measured {fastest}", "kind": "attention_choice", "point": point,
                    "chosen": chosen, "fastest": fastest, "measured": measured, "estimated_s": costs})


def bench_total_cpu(s, point, args, flex: Flex | None):
    """A few Qwen2 decoder layers (and the last-token LM head): dense SDPA vs a copy with the compact FFN
    and FlexAttention path-sparse attention (same masks in every layer, so one BlockMask)."""
    import copy

    from transformers import Qwen2ForCausalLM
    from transformers.modeling_utils import AttentionInterface

    config = qwen2_config(s)
    config._attn_implementation_internal = "sdpa"
    torch.manual_seed(0)
    dense = Qwen2ForCausalLM(config).eval()
    model = copy.deepcopy(dense)
    plan = plan_for(config, point, attention=flex is not None)
    ids = torch.cat([torch.full((s["system"],), 5), torch.full((s["V"],), config.image_token_id),
                     torch.full((s["T"],), 7)])[None]
    handle = swap_compact_ffn(model, plan, args.align, mask_attention=False)
    note = "  [attention dense SDPA: lightprune.width.kernels.path_attention is not there]"
    if flex is not None:
        state, name = handle.hooks.state, "lightprune_bench_path_flex"
        mod = modality_codes(s["system"], s["V"], s["T"], torch.device("cpu"))
        mask = flex.block_mask(point, mod, plan.attn_keep[0], s["heads"])

        def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
            if not torch.equal(state.modality, mod):
                raise RuntimeError("bench total: the recorded token modality is not the prebuilt BlockMask's")
            out = flex(query, key, value, state.modality, plan.attn_keep[module.layer_idx], mask, scale=scaling)
            return out.transpose(1, 2).contiguous(), None

        AttentionInterface.register(name, attention)
        model.config._attn_implementation_internal = name
        note = flex.note
    try:
        times = timeit({"dense": lambda: dense(input_ids=ids, logits_to_keep=1),
                        "pruned": lambda: model(input_ids=ids, logits_to_keep=1)},
                       args.repeats, args.warmup, torch.device("cpu"))
    finally:
        handle.remove()
    fraction = decoder_flops(config, s["V"], s["T"], plan, args.align).fraction
    report("total", point, times, fraction, None, f"  [{s['layers']} layers + LM head]{note}")


def bench_gpu(args, device, s7: dict | None = None, profiles: dict | None = None):
    """The paper's 7B per-layer shapes in bf16: compact vs dense FFN; every path attention vs dense SDPA and the
    cost model's choice judged (<= 0.75 at LLaVA-OneVision's shape, <= 1.0 everywhere)."""
    s7 = s7 or dict(d=3584, heads=28, kv=4, head_dim=128, m=18944, layers=1)
    have_triton = importlib.util.find_spec("lightprune.width.kernels.path_attention_triton") is not None \
        and importlib.util.find_spec("triton") is not None
    from lightprune.width.kernels.attention_cost import measure_profile

    flex = Flex(args.quick, where=device.type.upper())  # compiled for the GPU
    t0 = time.perf_counter()
    tokens = None if device.type == "cuda" else 128  # the CPU rehearsal of this part: small
    measured = measure_profile(device, torch.bfloat16 if device.type == "cuda" else torch.float32, tokens=tokens)
    print(f"note: attention cost profile measured on {device.type} in {time.perf_counter() - t0:.1f} s: "
          f"{measured.record()}")
    for point, (V, T) in (profiles or PROFILES_7B).items():
        s = dict(s7, V=V, T=T, system=POINTS[point][2])
        bench_ffn(s, point, args, device, torch.bfloat16, target=FFN_GPU_TARGETS.get(point, 1.0))
        bench_attention(s, point, args, device, torch.bfloat16, flex, target=ATTENTION_TARGETS.get(point, 1.0),
                        triton=have_triton, profile=measured)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, a few seconds (CPU part only)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per side (default 7, quick 3)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up calls per side (default 2, quick 1)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                        help="cpu: CPU part only; cuda: CPU part and the GPU part (an error without CUDA); "
                             "auto: the GPU part when CUDA is available")
    parser.add_argument("--align", type=int, default=64, help="compact FFN channel alignment b")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads (default 1: on shared cores multi-threaded GEMMs time the scheduler)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (3 if args.quick else 7)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    if args.repeats < 1 or args.warmup < 0 or args.threads < 1:
        parser.error(f"--repeats and --threads must be >= 1 and --warmup >= 0, got {args.repeats}, "
                     f"{args.threads}, {args.warmup}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False on this machine")
    gpu = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available() and not args.quick)
    torch.set_num_threads(args.threads)
    s = shapes(args.quick)
    print(f"bench_prefill: torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s), repeats "
          f"{args.repeats} (interleaved), warm-up {args.warmup}, align {args.align}")
    print(f"CPU fp32 shapes: d {s['d']}, heads {s['heads']}/{s['kv']} x {s['head_dim']}, m {s['m']}, "
          f"V {s['V']}, T {s['T']}, system {s['system']}, total: {s['layers']} layers")
    print("columns: pruned/dense time (ratio of medians, of minimums); retained FLOPs fraction (D.4; attention: "
          "retained causal pairs)")
    cpu = torch.device("cpu")
    with torch.inference_mode():
        for point in POINTS:
            target = FFN_CPU_TARGET if POINTS[point][1] == 0.5 and not args.quick else None
            bench_ffn(s, point, args, cpu, torch.float32, target)
        flex = None
        if importlib.util.find_spec("lightprune.width.kernels.path_attention") is None:
            print("note: lightprune.width.kernels.path_attention is not there: CPU attention skipped, total with dense "
                  "attention")
        else:
            flex = Flex(args.quick)
            for point in POINTS:
                bench_attention(s, point, args, cpu, torch.float32, flex)
        for point in POINTS:
            bench_total_cpu(s, point, args, flex)
        if gpu:
            print(f"GPU bf16, 7B shapes per layer on {torch.cuda.get_device_name()}")
            bench_gpu(args, torch.device("cuda"))
    if args.json is not None:
        judged = [r["passed"] for r in RESULTS if r["passed"] is not None]
        figures = {"benchmark": "prefill", "title": "MWOP prefill: pruned vs dense",
                   "what": " ".join(__doc__.split("\n\n")[0].split()), "quick": args.quick,
                   "torch_threads": torch.get_num_threads(), "torch_version": torch.__version__,
                   "repeats": args.repeats, "warmup": args.warmup, "align": args.align,
                   "shapes": {"cpu_fp32": s, **({"gpu_bf16_7b": {"device": torch.cuda.get_device_name(),
                                                                  "profiles": PROFILES_7B}} if gpu else {})},
                   "flex_compiled": None if flex is None else flex.compile,
                   "checks": RESULTS, "passed": all(judged) if judged else None}
        write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Out of core: time and peak memory of the streamed paths (weight scores, ``prune_checkpoint``, sequential
calibration) against the disk and against the in-memory paths, on a generated checkpoint, side by side in one run.

The checkpoint is generated here, never downloaded: a Qwen3-MoE config of one of :data:`SHAPES` (``full``:
Qwen3-30B-A3B's layer shapes, hidden 2048, 128 experts of width 768, top-8, 32 query / 4 key-value heads of 128,
1.26 GB a layer; ``mid``: hidden 1024, 128 experts of width 384, 0.3 GB a layer; ``quick``: seconds, checks the
script) and ``--layers`` decoder layers, a small vocabulary, bf16 values drawn from a seeded generator, written as
transformers' per-expert keys in shards of at most 512 MB (one tensor at a time, with lightprune's streaming writer).

The disk, measured in the parent: every shard read once with the page cache warm (what the streamed paths read
from here), the same with the shards' pages dropped first (``posix_fadvise DONTNEED``: the device), a copy of the
checkpoint (``copytree`` + ``sync``), and a write of one shard's bytes with ``fsync``. Each lightprune path runs in
its own process, its time taken around the call (imports excluded) and its peak memory its own ``VmHWM``
(``/proc/self/status`` read at its end: ``ru_maxrss`` survives ``execve``, so a child of a large parent can report
the parent's peak):

- score <criterion>: ``lp.score_weights(path, criterion)`` for every weight criterion that reads tensors, its
  second call in the process (the first, printed too, also imports the model's modules: seconds, once per
  process), against a read of the bytes that criterion reads (the keys of ``Criterion.weight_modules``, layer by
  layer into a buffer the size of a layer's share: memory that holds what it reads, as the score's does), with
  the page cache warm and, as ``(cold)``, with the shards' pages dropped before both (what a checkpoint larger
  than memory gives: every byte from the device), each the best of two. A score call also opens the checkpoint
  (headers, the meta model, its key map: a fixed ~0.3 s here, not per layer), so the ratio is printed with and
  without it; the one without is what a 1 TB checkpoint sees. Router norm reads a few KB a layer: its time is
  the opening's, so its ratios are printed and not judged;
- stream prune: ``lp.prune_checkpoint`` (verification on, then off) of the AIMER plan at ratio 0.5, ``sync``
  included, against the copy; without verification twice, its best against the best of three copies measured
  before, between and after (the disk's speed moves by 2x within a run here);
- memory prune: ``from_pretrained``, the same scores and plan, ``lp.export_pruned`` (prune, save, reload, verify);
- stream / memory calibration: ``lp.collect_expert_stats`` (default criteria, subsets all + text) on the same
  ``--batches`` batches of 2 x 128 token ids, from the directory or from the loaded model;
- calibration across processes: the streamed calibration in one process of 2 threads, and in 2 processes of 1
  thread each joined by gloo (``torch.distributed`` over TCP on this host), each given every other batch: each
  rank's passes and its all-reduce of the sums (``metadata["seconds"]``), and the ranks' statistics against those of
  one process of one thread, the ranks' kernels (float64 sums added in another order: rounding only; 2 threads sum
  bf16 products in another order, which can flip a near tie of the routing).

Printed: the table (seconds, ratio to its disk reference, peak VmHWM / checkpoint bytes), the results' identity
(the two pruned checkpoints tensor by tensor, the two sets of statistics value by value), and from the measured
rates the time of each streamed path on a 1 TB checkpoint of the same layer shape (the score's from its cold
figure). Targets (issue 39): score / read <= 2.0 (warm and cold), prune / copy <= 1.5 (verified; a quantized
checkpoint's, issue 50: <= 1.0 without verification, which writes fewer bytes than the copy; verifying it is
dequantizing it, computed and reported), sequential / in-memory calibration <= 1.3, streamed VmHWM <= 0.4 of the
checkpoint (6+ layers), results identical; issue 51: the all-reduce <= 5% of a rank's pass, the ranks' statistics
the one process's to 1e-9 of their scale. ``--baseline-src DIR``: the streamed paths run a second time with
``DIR/src`` first on ``PYTHONPATH`` (another checkout: the figures before a change), in the same run.

    python scripts/bench_out_of_core.py [--shape full|mid|quick] [--layers 6] [--batches 4] [--work-dir DIR]
                                        [--keep] [--baseline-src DIR] [--json PATH] [--fp8 | --int4]

``--quick`` is ``--shape quick --layers 4`` (about 26 MB: checks the script; ratios printed, not judged).

``--fp8`` / ``--int4``: the generated checkpoint is written FP8 block-scaled (``lp.quantize_checkpoint``, 128x128
blocks, the DeepSeek-V3 layout) / with its routed experts in compressed-tensors int4 (W4A16, symmetric groups of 32,
as Kimi K2 Thinking ships them), and every path runs on that one: the streamed ones read it dequantized a tensor at a
time and ``prune_checkpoint`` copies the kept experts' stored bytes; the in-memory ones load it with
``lp.load_pruned`` (dequantized to bf16), so the two pruned checkpoints are compared as lightprune reads them
(dequantized). The reads a score is compared with are of the stored bytes (values and scales), and the prune target
is 1.0 of the copy (it writes fewer bytes than a copy does).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from bench_figures import check, write_json  # noqa: E402  (scripts/ is on sys.path when a script runs)

from lightprune.core.jsonio import read_json  # noqa: E402

__all__ = ["write_checkpoint", "main"]

SHAPES = {"full": dict(hidden_size=2048, num_experts=128, moe_intermediate_size=768, num_attention_heads=32,
                       num_key_value_heads=4, head_dim=128, intermediate_size=6144, vocab_size=8192),
          "mid": dict(hidden_size=1024, num_experts=128, moe_intermediate_size=384, num_attention_heads=16,
                      num_key_value_heads=4, head_dim=64, intermediate_size=3072, vocab_size=8192),
          "quick": dict(hidden_size=256, num_experts=16, moe_intermediate_size=128, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=64, intermediate_size=512, vocab_size=1024)}
SHARD_BYTES = 512 * 1024 * 1024
_LAYER_OF_KEY = re.compile(r"\.layers\.(\d+)\.")


def _config(layers: int, shape: str):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(**SHAPES[shape], num_hidden_layers=layers, num_experts_per_tok=8,
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


def write_checkpoint(path: Path, layers: int, shape_name: str, seed: int = 0) -> int:
    """Generate the benchmark checkpoint of :data:`SHAPES` ``shape_name`` at ``path`` (see the module docstring);
    returns its tensor bytes."""
    from lightprune.checkpoints.writer import SafetensorsWriter

    config = _config(layers, shape_name)
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


def write_int4_experts(path: Path) -> None:
    """Rewrite the checkpoint at ``path`` in place with its routed experts in compressed-tensors int4 (W4A16,
    symmetric groups of 32: lightprune's packing, :mod:`lightprune.checkpoints.compressed_tensors`), as Kimi K2
    Thinking ships its experts; one shard at a time."""
    from safetensors.torch import load_file, save_file

    from lightprune.checkpoints.compressed_tensors import pack_int4, quantize_int4

    index = read_json(path / "model.safetensors.index.json", "index")
    for file in sorted(path.glob("*.safetensors")):
        written = {}
        for key, tensor in load_file(file).items():
            if ".mlp.experts." in key and key.endswith(".weight"):
                values, scale = quantize_int4(tensor, 32)
                written[key + "_packed"], written[key + "_scale"] = pack_int4(values), scale
                written[key + "_shape"] = torch.tensor(list(tensor.shape), dtype=torch.int32)
            else:
                written[key] = tensor
        save_file(written, file, metadata={"format": "pt"})
        index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != file.name}
        index["weight_map"].update({k: file.name for k in written})
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    config = read_json(path / "config.json", "config")
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32,
               "dynamic": False, "actorder": None}
    config["quantization_config"] = {
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None}},
        "format": "pack-quantized", "ignore": ["lm_head", "re:.*self_attn.*", "re:.*mlp.gate$"],
        "quant_method": "compressed-tensors", "quantization_status": "compressed"}
    (path / "config.json").write_text(json.dumps(config, indent=1))


# ------------------------------------------------------------------ the measured runs, each in its own process
_EPILOGUE = """
import json, re
_hwm = int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
open(OUT + ".figures.json", "w").write(json.dumps({"seconds": SECONDS, "first_call_s": globals().get("FIRST"),
                                                   "opening_s": globals().get("OPENING"), "vmhwm_bytes": _hwm,
                                                   "passes_s": globals().get("PASSES"),
                                                   "all_reduce_s": globals().get("ALL_REDUCE")}))
"""
_RUNS = {
    "score": """
import os, time
import lightprune as lp
from lightprune.checkpoints import Checkpoint, Skeleton
start = time.perf_counter()
lp.score_weights(PATH, CRITERION, progress=False)
FIRST = time.perf_counter() - start  # with the lazy imports of the model's modules
start = time.perf_counter()
with Checkpoint(PATH) as checkpoint:
    Skeleton(checkpoint)
OPENING = time.perf_counter() - start  # headers, config, the meta model and its key map: once per call
SECONDS = float("inf")
for _ in range(2):  # the best of two calls (a shared disk and CPU move single figures)
    if COLD:
        for file in Checkpoint(PATH).files:
            fd = os.open(file, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    start = time.perf_counter()
    scores = lp.score_weights(PATH, CRITERION, progress=False)
    SECONDS = min(SECONDS, time.perf_counter() - start)
torch.save(dict(scores.raw), OUT + ".pt")
""",
    "stream_prune": """
import os, time
import lightprune as lp
plan = lp.select_experts(lp.score_weights(PATH, "aimer", progress=False), ratio=0.5)
plan.save(OUT + ".plan.json")
start = time.perf_counter()
lp.prune_checkpoint(PATH, plan, OUT, progress=False, verify=VERIFY)
os.sync()
SECONDS = time.perf_counter() - start
""",
    "memory_prune": """
import time
import lightprune as lp
from transformers import AutoModelForCausalLM
start = time.perf_counter()
model = (lp.load_pruned(PATH, dtype=torch.bfloat16) if QUANTIZED else
         AutoModelForCausalLM.from_pretrained(PATH, dtype=torch.bfloat16).eval())
scores = lp.score_weights(model, "aimer")
torch.save(dict(scores.raw), OUT + ".pt")
plan = lp.select_experts(scores, ratio=0.5)
plan.save(OUT + ".plan.json")
lp.export_pruned(model, plan, OUT)
SECONDS = time.perf_counter() - start
""",
    "stream_calibrate": """
import time
import lightprune as lp
start = time.perf_counter()
stats = lp.collect_expert_stats(PATH, BATCHES, subsets=("all", "text"), progress=False)
SECONDS = time.perf_counter() - start
torch.save({(c, u): dict(stats.raw(c, u)) for c in stats.criteria for u in stats.subsets}, OUT + ".pt")
""",
    "rank_calibrate": """
import time
import torch.distributed as dist
torch.set_num_threads(THREADS)
if WORLD > 1:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{PORT}", rank=RANK, world_size=WORLD)
import lightprune as lp
start = time.perf_counter()
stats = lp.collect_expert_stats(PATH, BATCHES[RANK::WORLD], subsets=("all", "text"), progress=False)
SECONDS = time.perf_counter() - start
PASSES, ALL_REDUCE = stats.metadata["seconds"]["passes"], stats.metadata["seconds"]["all_reduce"]
torch.save({(c, u): dict(stats.raw(c, u)) for c in stats.criteria for u in stats.subsets}, OUT + ".pt")
if WORLD > 1:
    dist.destroy_process_group()
""",
    "memory_calibrate": """
import time
import lightprune as lp
from transformers import AutoModelForCausalLM
start = time.perf_counter()
model = (lp.load_pruned(PATH, dtype=torch.bfloat16) if QUANTIZED else
         AutoModelForCausalLM.from_pretrained(PATH, dtype=torch.bfloat16).eval())
stats = lp.collect_expert_stats(model, BATCHES, subsets=("all", "text"), progress=False)
SECONDS = time.perf_counter() - start
torch.save({(c, u): dict(stats.raw(c, u)) for c in stats.criteria for u in stats.subsets}, OUT + ".pt")
""",
}
#: the weight criteria that read tensors (random reads none)
SCORED = ("aimer", "magnitude", "router_norm")
#: those judged against a read of their bytes: router norm reads a few KB a layer, so its time is that of opening
#: the checkpoint (printed), which no read of its bytes can be compared with
JUDGED_SCORES = ("aimer", "magnitude")


def _child(kind: str, path: Path, out: Path, batches: int, vocab: int, src: Path | None = None,
           **values) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of a fresh process running ``_RUNS[kind]`` (``values`` bound as upper-case
    names; ``src``: that checkout's package first on the path)."""
    prelude = (f"import torch\nPATH, OUT = {str(path)!r}, {str(out)!r}\n"
               + "".join(f"{k.upper()} = {v!r}\n" for k, v in values.items())
               + "gen = torch.Generator().manual_seed(1)\n"
               f"BATCHES = [{{'input_ids': torch.randint(3, {vocab}, (2, 128), generator=gen)}} "
               f"for _ in range({batches})]\n")
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src / "src"), *filter(None, [env.get("PYTHONPATH")])])
    return [sys.executable, "-c", prelude + _RUNS[kind] + _EPILOGUE], env


def _figures(out: Path, wall: float) -> dict:
    figures = read_json(Path(str(out) + ".figures.json"), "figures")
    return {"seconds": figures["seconds"], "first_call_s": figures["first_call_s"], "opening_s": figures["opening_s"],
            "wall_s": wall, "peak_rss_bytes": figures["vmhwm_bytes"], "passes_s": figures.get("passes_s"),
            "all_reduce_s": figures.get("all_reduce_s")}


def _run(kind: str, path: Path, out: Path, batches: int, vocab: int, src: Path | None = None, **values) -> dict:
    """Run ``_RUNS[kind]`` in a fresh process (``values`` bound as upper-case names; ``src``: that checkout's
    package first on the path); returns its seconds (around the call), wall seconds and VmHWM."""
    command, env = _child(kind, path, out, batches, vocab, src, **values)
    start = time.perf_counter()
    done = subprocess.run(command, stderr=subprocess.PIPE, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{kind} {values} failed:\n{done.stderr[-4000:]}")
    return _figures(out, wall)


def _run_ranks(path: Path, out: Path, batches: int, vocab: int, world: int) -> list[dict]:
    """Streamed calibration in ``world`` processes at once, one thread each, joined by gloo over TCP on this host,
    each given every ``world``-th batch: each rank's figures (its passes' seconds and its all-reduce's)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    children = [_child("rank_calibrate", path, Path(f"{out}.rank{rank}"), batches, vocab, rank=rank, world=world,
                       port=port, threads=1) for rank in range(world)]
    start = time.perf_counter()
    procs = [subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env) for command, env in children]
    errors = [proc.communicate()[1] for proc in procs]
    wall = time.perf_counter() - start
    if any(proc.returncode for proc in procs):
        raise RuntimeError("rank_calibrate failed:\n" + "\n".join(e[-3000:] for e in errors))
    return [_figures(Path(f"{out}.rank{rank}"), wall) for rank in range(world)]


# ------------------------------------------------------------------ the disk, measured here
def _read_files(files: list[Path], chunk: int = 64 << 20) -> float:
    buffer = bytearray(chunk)
    start = time.perf_counter()
    for file in files:
        with open(file, "rb", buffering=0) as handle:
            while handle.readinto(buffer):
                pass
    return time.perf_counter() - start


def _drop_cache(files: list[Path]) -> None:
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _read_keys(path: Path, keys: list[str], cold: bool = False) -> float:
    """Seconds to read exactly ``keys``' bytes (positioned reads, as the streamed paths read them), layer by layer
    into one buffer the size of the largest layer's share (memory that holds a layer, as a streamed path's does;
    not one small buffer read into again and again, which stays in the CPU's cache); ``cold``: the shards' pages
    dropped first."""
    from lightprune.checkpoints import Checkpoint

    layers: dict[int, list[str]] = {}
    for key in keys:
        number = _LAYER_OF_KEY.search(key)
        layers.setdefault(int(number.group(1)) if number else -1, []).append(key)
    with Checkpoint(path) as checkpoint:  # the stored bytes: a quantized tensor's values and scales
        layers = {n: [part for key in found for part in checkpoint.parts(key)] for n, found in layers.items()}
        buffer = torch.empty(max(sum(checkpoint.stored_nbytes(k) for k in found) for found in layers.values()),
                             dtype=torch.uint8)
        buffer.fill_(0)  # its pages mapped before the clock starts
        if cold:
            _drop_cache(checkpoint.files)
        start = time.perf_counter()
        for found in layers.values():
            offset = 0
            for key in found:
                size = checkpoint.stored_nbytes(key)
                checkpoint.read_stored_into(key, buffer[offset:offset + size].view(checkpoint.stored_dtype(key)))
                offset += size
        return time.perf_counter() - start


def _criterion_keys(path: Path, criterion: str) -> list[str]:
    """The checkpoint keys a streamed score of ``criterion`` reads: those of its ``weight_modules``."""
    from lightprune.checkpoints import Checkpoint, Skeleton
    from lightprune.experts.criteria import get_criterion
    from lightprune.experts.criteria.scoring import weight_module_names

    with Checkpoint(path) as checkpoint:
        skeleton = Skeleton(checkpoint)
        names = weight_module_names(skeleton, get_criterion(criterion))
        heads = tuple(f"{name}." for layer in names.values() for name in layer)
        return sorted(k for target, keys in skeleton.sources.items() if target.startswith(heads) for k in keys)


def _write_rate(work: Path, nbytes: int) -> float:
    """Bytes per second of writing ``nbytes`` to a new file and ``fsync``-ing it."""
    block = os.urandom(1 << 20) * 64
    target = work / "write-rate.bin"
    start = time.perf_counter()
    with open(target, "wb", buffering=0) as handle:
        left = nbytes
        while left > 0:
            left -= handle.write(block[:min(left, len(block))])
        os.fsync(handle.fileno())
    seconds = time.perf_counter() - start
    target.unlink()
    return nbytes / seconds


def copy_seconds(path: Path, work: Path) -> float:
    """Seconds to copy the checkpoint at ``path`` (``copytree``) and ``sync``, from a synced disk."""
    os.sync()
    copy_to = work / "copy"
    start = time.perf_counter()
    shutil.copytree(path, copy_to)
    os.sync()
    copied = time.perf_counter() - start
    shutil.rmtree(copy_to)
    return copied


def disk_figures(path: Path, work: Path) -> dict:
    files = sorted(path.glob("*.safetensors"))
    size = sum(f.stat().st_size for f in files)
    _read_files(files)  # into the page cache
    warm = min(_read_files(files) for _ in range(2))
    _drop_cache(files)
    cold = _read_files(files)
    copied = copy_seconds(path, work)
    _read_files(files)  # warm again for the runs
    return {"file_bytes": size, "read_warm_s": warm, "read_cold_s": cold, "copy_s": copied,
            "read_rate_cold": size / cold, "read_rate_warm": size / warm,
            "write_rate": _write_rate(work, min(size, 1 << 30))}


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


def _stats_gap(a: Path, b: Path) -> float:
    """The largest relative difference between two saved sets of statistics (float64 sums added in another order
    across ranks: rounding only)."""
    left, right = torch.load(a), torch.load(b)
    if left.keys() != right.keys():
        return float("inf")
    gap = 0.0
    for key in left:
        for layer in left[key]:
            x, y = left[key][layer].double(), right[key][layer].double()
            if x.numel():  # the difference on the scale of the tensor's largest value
                gap = max(gap, float((x - y).abs().max() / y.abs().max().clamp_min(1e-300)))
    return gap


def _same_scores(a: Path, b: Path) -> bool:
    left, right = torch.load(a), torch.load(b)
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


def _streamed(path: Path, work: Path, tag: str, vocab: int, batches: int, src: Path | None) -> dict:
    runs = {f"score {c}": _run("score", path, work / f"{tag}score_{c}", batches, vocab, src, criterion=c, cold=False)
            for c in SCORED}
    runs.update({f"score {c} (cold)": _run("score", path, work / f"{tag}score_{c}_cold", batches, vocab, src,
                                           criterion=c, cold=True) for c in SCORED})
    _read_files(sorted(path.glob("*.safetensors")))  # warm again for the runs that follow
    runs["prune (verified)"] = _run("stream_prune", path, work / f"{tag}stream_prune", batches, vocab, src,
                                    verify=True)
    # the copy this prune is judged against, measured beside it (before, between and after two prunes: the disk's
    # speed moves by 2x within one run here), each the best of its kind
    copies, prunes = [copy_seconds(path, work)], []
    for attempt in range(2):
        prunes.append(_run("stream_prune", path, work / f"{tag}stream_prune_nv{attempt}", batches, vocab, src,
                           verify=False))
        shutil.rmtree(work / f"{tag}stream_prune_nv{attempt}", ignore_errors=True)
        copies.append(copy_seconds(path, work))
    runs["prune (not verified)"] = {**min(prunes, key=lambda run: run["seconds"]), "copy_s": min(copies)}
    runs["calibration"] = _run("stream_calibrate", path, work / f"{tag}stream_calibrate", batches, vocab, src)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="full")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the generated checkpoint and the outputs")
    parser.add_argument("--baseline-src", type=Path, default=None, metavar="DIR",
                        help="another checkout whose streamed paths run too (its src/ first on PYTHONPATH)")
    parser.add_argument("--quick", action="store_true", help="--shape quick --layers 4")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH")
    parser.add_argument("--fp8", action="store_true", help="run on the checkpoint written FP8 block-scaled")
    parser.add_argument("--int4", action="store_true",
                        help="run on the checkpoint with its experts in compressed-tensors int4 (W4A16, groups of 32)")
    args = parser.parse_args(argv)
    if args.quick:
        args.shape, args.layers = "quick", 4
    if args.layers < 1 or args.batches < 1:
        parser.error(f"--layers and --batches must be >= 1, got {args.layers} and {args.batches}")
    if args.baseline_src is not None and not (args.baseline_src / "src" / "lightprune").is_dir():
        parser.error(f"--baseline-src {str(args.baseline_src)!r} has no src/lightprune")
    judged = args.shape != "quick"
    work = Path(tempfile.mkdtemp(prefix="lightprune-ooc-", dir=args.work_dir))
    try:
        path = work / "checkpoint"
        start = time.perf_counter()
        size = write_checkpoint(path, args.layers, args.shape)
        if args.fp8 and args.int4:
            parser.error("--fp8 and --int4 are two formats: give one")
        if args.fp8:
            import lightprune as lp

            lp.quantize_checkpoint(path, work / "checkpoint-fp8", block=(128, 128), progress=False)
            shutil.rmtree(path)
            path = work / "checkpoint-fp8"
            size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        if args.int4:
            write_int4_experts(path)
            size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        print(f"checkpoint: Qwen3-MoE, {args.layers} layers of {SHAPES[args.shape]}, "
              f"{'FP8 in 128x128 blocks' if args.fp8 else 'int4 experts' if args.int4 else 'bf16'}, "
              f"{size / 1e9:.2f} GB in "
              f"{len(list(path.glob('*.safetensors')))} shards (written in {time.perf_counter() - start:.0f} s); "
              f"one decoder layer is {1 / args.layers:.0%} of it; torch threads {torch.get_num_threads()}")
        vocab = SHAPES[args.shape]["vocab_size"]
        disk = disk_figures(path, work)
        print(f"disk: read {disk['read_rate_cold'] / 1e6:.0f} MB/s (pages dropped), "
              f"{disk['read_rate_warm'] / 1e6:.0f} MB/s (page cache), write {disk['write_rate'] / 1e6:.0f} MB/s "
              f"(fsync), copy {disk['copy_s']:.1f} s")
        keys = {c: _criterion_keys(path, c) for c in SCORED}
        reads = {c: min(_read_keys(path, keys[c]) for _ in range(2)) for c in SCORED}
        cold_reads = {c: min(_read_keys(path, keys[c], cold=True) for _ in range(2)) for c in SCORED}
        _read_files(sorted(path.glob("*.safetensors")))  # warm again for the runs
        runs = _streamed(path, work, "", vocab, args.batches, None)
        before = _streamed(path, work, "before_", vocab, args.batches, args.baseline_src) \
            if args.baseline_src is not None else None
        quantized = bool(args.fp8 or args.int4)
        runs["memory prune"] = _run("memory_prune", path, work / "memory_prune", args.batches, vocab,
                                    quantized=quantized)
        runs["memory calibration"] = _run("memory_calibrate", path, work / "memory_calibrate", args.batches, vocab,
                                          quantized=quantized)
        # the same streamed calibration in one process of 2 threads, and in 2 gloo processes of 1 thread each
        runs["calibration, 1 process x 2 threads"] = _run("rank_calibrate", path, work / "one_process", args.batches,
                                                          vocab, rank=0, world=1, port=0, threads=2)
        # the statistics the ranks must give: one process computing with their kernels (one thread: bf16 products
        # summed in another order by 2 threads can flip a near tie of the routing)
        runs["calibration, 1 process x 1 thread"] = _run("rank_calibrate", path, work / "one_thread",
                                                         max(args.batches, 2), vocab, rank=0, world=1, port=0,
                                                         threads=1)
        ranks = _run_ranks(path, work / "ranks", max(args.batches, 2), vocab, world=2)
        runs["calibration, 2 ranks x 1 thread"] = {**max(ranks, key=lambda run: run["seconds"]), "ranks": ranks}
        reference = {**{f"score {c}": (reads[c], f"read of its {c} bytes") for c in SCORED},
                     **{f"score {c} (cold)": (cold_reads[c], f"cold read of its {c} bytes") for c in SCORED},
                     "prune (verified)": (disk["copy_s"], "copy"),
                     "prune (not verified)": (runs["prune (not verified)"]["copy_s"], "copy beside it"),
                     "calibration": (runs["memory calibration"]["seconds"], "in-memory calibration")}
        ratios = {name: runs[name]["seconds"] / ref for name, (ref, _) in reference.items()}
        print(f"  {'path':24s} {'s':>8s} {'reference':>40s} {'ratio':>6s} {'VmHWM/ckpt':>11s}"
              + (f" {'before s':>9s} {'ratio':>6s}" if before else ""))
        for name, (ref, what) in reference.items():
            line = (f"  {name:24s} {runs[name]['seconds']:8.2f} {what + f' {ref:.2f} s':>40s} {ratios[name]:6.2f} "
                    f"{runs[name]['peak_rss_bytes'] / size:11.3f}")
            if before:
                line += f" {before[name]['seconds']:9.2f} {before[name]['seconds'] / ref:6.2f}"
            print(line)
        print("  first call of each score in its process (imports included): " + ", ".join(
            f"{c} {runs[f'score {c}']['first_call_s']:.2f} s" for c in SCORED))
        opening = runs["score aimer"]["opening_s"]
        steady = {f"score {c}{cold}": (runs[f"score {c}{cold}"]["seconds"] - opening) / reference[f"score {c}{cold}"][0]
                  for c in JUDGED_SCORES for cold in ("", " (cold)")}
        print(f"  of each score call, opening the checkpoint (headers, the meta model, its key map; once per call, "
              f"not per layer): {opening:.2f} s; without it, score / read: "
              + ", ".join(f"{name.removeprefix('score ')} {ratio:.2f}" for name, ratio in steady.items()))
        for name in ("memory prune", "memory calibration"):
            print(f"  {name:24s} {runs[name]['seconds']:8.2f} {'':>40s} {'':>6s} "
                  f"{runs[name]['peak_rss_bytes'] / size:11.3f}")
        terabyte = 1e12 / size
        print(f"  on a 1 TB checkpoint of this layer shape here: copy {disk['copy_s'] * terabyte / 3600:.2f} h "
              f"(disk alone: read {1e12 / disk['read_rate_cold'] / 3600:.2f} h + write "
              f"{1e12 / disk['write_rate'] / 3600:.2f} h), score aimer "
              f"{runs['score aimer (cold)']['seconds'] * terabyte / 3600:.2f} h (from the device), prune (verified) "
              f"{runs['prune (verified)']['seconds'] * terabyte / 3600:.2f} h")
        same_prune = _same_checkpoints(work / "stream_prune", work / "memory_prune") and \
            read_json(work / "stream_prune.plan.json", "plan")["keep"] == \
            read_json(work / "memory_prune.plan.json", "plan")["keep"]
        same_scores = _same_scores(Path(f"{work / 'score_aimer'}.pt"), work / "memory_prune.pt")
        same_stats = _same_stats(work / "stream_calibrate.pt", work / "memory_calibrate.pt")
        one = runs["calibration, 1 process x 2 threads"]
        reduce_share = max(rank["all_reduce_s"] / rank["passes_s"] for rank in ranks)
        rank_gap = max(_stats_gap(work / f"ranks.rank{r}.pt", work / "one_thread.pt") for r in range(2))
        two_s = max(rank["passes_s"] + rank["all_reduce_s"] for rank in ranks)
        print(f"  calibration across processes ({max(args.batches, 2)} batches; the passes and the all-reduce, "
              f"opening and imports excluded): 1 process x 2 threads {one['passes_s']:.2f} s; 2 gloo ranks x 1 "
              "thread (" + ", ".join(f"rank {r}: passes {rank['passes_s']:.2f} s, all-reduce "
                                     f"{rank['all_reduce_s'] * 1e3:.1f} ms" for r, rank in enumerate(ranks))
              + f"); all-reduce / pass {reduce_share:.4f}; 2 ranks / 1 process {two_s / one['passes_s']:.2f}; "
              f"largest difference of the ranks' statistics from one process's of one thread {rank_gap:.1e} of "
              "their scale")
        print(f"  identical results: pruned checkpoints {same_prune}, AIMER scores {same_scores}, calibration "
              f"statistics {same_stats}")
        checks = [check(f"{name} / {reference[name][1].split(' of ')[0]}", ratios[name], target if judged else None,
                        "<=" if judged else None, reference=before[name]["seconds"] / reference[name][0]
                        if before else None, reference_name="before" if before else None)
                  for name, target in [*((f"score {c}{cold}", 2.0) for c in JUDGED_SCORES for cold in ("", " (cold)")),
                                       ("prune (not verified)" if quantized else "prune (verified)",
                                        1.0 if quantized else 1.5), ("calibration", 1.3)]]
        checks += [check(f"{name} per layer (opening excluded: what a 1 TB checkpoint sees) / read", ratio,
                         2.0 if judged else None, "<=" if judged else None) for name, ratio in steady.items()]
        checks += [check(f"{kind} peak VmHWM / checkpoint bytes", runs[name]["peak_rss_bytes"] / size,
                         0.4 if judged and args.layers >= 6 else None, "<=" if judged and args.layers >= 6 else None,
                         reference=runs[memory]["peak_rss_bytes"] / size, reference_name="in memory")
                   for kind, name, memory in (("prune", "prune (verified)", "memory prune"),
                                              ("calibration", "calibration", "memory calibration"))]
        checks += [check("calibration across 2 gloo ranks: all-reduce / pass", reduce_share,
                         0.05 if judged else None, "<=" if judged else None),
                   check("calibration across 2 gloo ranks: statistics against one process's, relative difference",
                         rank_gap, 1e-9, "<=")]
        checks += [check("pruned checkpoints identical", same_prune, True, "=="),
                   check("AIMER scores identical", same_scores, True, "=="),
                   check("calibration statistics identical", same_stats, True, "==")]
        passed = all(c["passed"] is not False for c in checks)
        failed = [c["name"] for c in checks if c["passed"] is False]
        print(f"{'PASS' if passed else 'FAIL'}" + (f": {', '.join(failed)}" if failed else "")
              + ("" if judged else " (quick shape: ratios printed, not judged)"))
        if args.json is not None:
            write_json(args.json, {
                "benchmark": "out_of_core", "title": "Out-of-core scoring, pruning and calibration",
                "what": " ".join(__doc__.split("\n\n")[0].split()), "quick": not judged,
                "checkpoint": {"layers": args.layers, "bytes": size, "shape": args.shape, **SHAPES[args.shape],
                               "stored": "fp8 (128x128 blocks)" if args.fp8 else
                               "int4 experts (compressed-tensors, groups of 32)" if args.int4 else "bf16"},
                "batches": args.batches, "disk": disk, "reads": reads, "runs": runs, "before": before,
                "checks": checks, "passed": passed, "torch_version": torch.__version__})
        return 0 if passed else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


if __name__ == "__main__":
    raise SystemExit(main())

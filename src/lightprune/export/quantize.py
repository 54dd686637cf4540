"""Prune, then quantize: a float checkpoint written as FP8 block-scaled, shard by shard: [`quantize_checkpoint`][].

The layout and config are DeepSeek-V3's release ("DeepSeek-V3 Technical Report", arXiv 2412.19437, section 3.3.2),
which transformers (``quant_method: "fp8"``) and the serving stacks load: each linear layer's ``weight`` of a decoder
layer (attention projections, dense MLPs, shared experts and every routed expert) as float8_e4m3fn with a float32
``weight_scale_inv`` per ``block`` of it (`lightprune.checkpoints.fp8_blocks.quantize_fp8_blocks`: amax / 448
per block); embeddings, the output head, norms, routers and their biases, and the tensors of a multi-token-prediction
module outside its decoder layer, as they were. config.json gains ``quantization_config`` = ``{"quant_method":
"fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": block}``.

Each output shard keeps its source's name and holds a tensor in memory at a time. Before it is renamed into place
(`staging_dir`: a failure leaves ``out_dir`` as it was), the result is read back
through the strict reader and every quantized tensor compared with its source: ``|dequantize(q) - w| <= 2^-4 |w| +
2^-10 scale`` per element (float8_e4m3fn's rounding: half a unit of its 3 mantissa bits, half its smallest
subnormal step, 2^-9, below its normal range).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from lightprune.checkpoints.directory import SAFE_INDEX, checkpoint_directory, read_config
from lightprune.checkpoints.fp8_blocks import block_size, dequantize_fp8_blocks, quantize_fp8_blocks, scale_factors
from lightprune.checkpoints.reader import Checkpoint
from lightprune.checkpoints.skeleton import EXPERT_INDEX, Skeleton
from lightprune.checkpoints.staging import staging_dir
from lightprune.checkpoints.writer import SafetensorsWriter
from lightprune.core.checks import check_choice
from lightprune.core.choices import QUANTIZE_FORMATS
from lightprune.core.paths import check_path_text
from lightprune.export.save import apply_umask
from lightprune.export.source import check_not_source
from lightprune.export.tokenizer_files import copy_generation_config, copy_tokenizer_files
from lightprune.export.verify import check_written_finite
from lightprune.models import find_moe_layers

__all__ = ["quantize_checkpoint"]

_SCALE = "_scale_inv"


def fp8_weight_keys(skeleton: Skeleton) -> set[str]:
    """The checkpoint keys [`quantize_checkpoint`][] stores as FP8: the 2-dimensional ``.weight`` of every
    ``nn.Linear`` of a decoder layer and every routed expert's (per-expert keys), but the MoE routers' and the output
    head's (see the module docstring)."""
    model, checkpoint = skeleton.model, skeleton.checkpoint
    modules = dict(model.named_modules())
    routers = {f"{layer.name}.{name}" for layer in find_moe_layers(model)
               for name, module in layer.block.named_modules() if module in (layer.router, layer.router_linear)}
    head = model.get_output_embeddings()
    out = set()
    for key in checkpoint.keys():
        target = skeleton.targets.get(key, (None, None))[0]
        if target is None or not key.endswith(".weight") or len(checkpoint.shape(key)) != 2 or ".layers." not in key:
            continue
        owner = target.rpartition(".")[0]
        module = modules.get(owner)
        if owner in routers or module is head:
            continue
        if isinstance(module, nn.Linear) or EXPERT_INDEX.search(key):
            out.add(key)
    return out


def quantize_checkpoint(src_dir: str | os.PathLike, out_dir: str | os.PathLike, *, block: tuple[int, int] = (128, 128),
                        overwrite: bool = False, verify: bool = True, progress: bool = True) -> Path:
    """Write the float checkpoint at ``src_dir`` to ``out_dir`` as FP8 block-scaled (see the module docstring);
    returns ``out_dir``'s absolute path. ``block``: the rows and columns of a scale's block (the releases' (128,
    128)); ``verify``: read the result back and check every quantized tensor within float8's rounding."""
    start = time.perf_counter()
    block = block_size(block, "block")
    checkpoint_directory(Path(src_dir).expanduser())
    check_path_text(out_dir, "output directory")
    src = Path(src_dir).expanduser().absolute()
    check_not_source(out_dir, src)
    with Checkpoint(src) as checkpoint:
        _check_float(checkpoint)
        with staging_dir(out_dir, overwrite) as tmp:
            count = _quantized_copy(checkpoint, tmp, block, verify, progress)
            copy_tokenizer_files(src, tmp)
            copy_generation_config(src, tmp)
            apply_umask(tmp)
    if progress:
        print(f"quantized {count} tensors of {src.name} to FP8 ({block[0]}x{block[1]} blocks) in "
              f"{time.perf_counter() - start:.1f}s")
    return Path(out_dir).expanduser().absolute()


def check_quantize(quantize: str | None) -> str | None:
    """The ``quantize`` option of an export (`QUANTIZE_FORMATS`): None (the weights
    as they are) or ``"fp8"`` (FP8 block-scaled, after the pruned checkpoint is verified)."""
    return check_choice("quantize", quantize, QUANTIZE_FORMATS)


def model_block(model: nn.Module, source: Path | None) -> tuple[int, int]:
    """The block an in-memory export quantizes ``model`` in: the FP8 ``weight_block_size`` of its config or of its
    ``source`` checkpoint's (a model loaded from an FP8 checkpoint, dequantized: requantized in the same blocks, an
    expert's scales and values come back as they were stored when its scale was its block's amax / 448), else
    128x128."""
    found = getattr(model.config, "quantization_config", None)
    if found is None and source is not None and (source / "config.json").is_file():
        found = read_config(source).get("quantization_config")
    found = found if isinstance(found, dict) else getattr(found, "to_dict", dict)()
    if found.get("quant_method") == "fp8":  # a source that loaded has a valid one (the strict reader checked it)
        return block_size(found.get("weight_block_size") or [128, 128], "its weight_block_size")
    return 128, 128


def quantize_staged(tmp: Path, block: tuple[int, int] = (128, 128), progress: bool = False) -> dict[str, Any]:
    """Rewrite the float checkpoint staged in ``tmp`` (an export's, verified) as FP8 block-scaled in place, verified
    within float8's rounding; returns what the manifest says of it."""
    work = tmp / ".lightprune-fp8"
    with Checkpoint(tmp) as checkpoint:
        _check_float(checkpoint)
        count = _quantized_copy(checkpoint, work, block, True, progress)
        files = [file.name for file in checkpoint.files]
    for name in [*files, "config.json", *([SAFE_INDEX] if (work / SAFE_INDEX).exists() else [])]:
        os.replace(work / name, tmp / name)
    shutil.rmtree(work)
    return {"quant_method": "fp8", "weight_block_size": list(block), "quantized_tensors": count,
            "stored_as": "quantized by lightprune after pruning"}


def _check_float(checkpoint: Checkpoint) -> None:
    if checkpoint.quantization is not None:
        raise ValueError(f"checkpoint {str(checkpoint.path)!r} is already quantized (quant_method "
                         f"{checkpoint.quantization.method!r}): quantizing takes a float checkpoint (a quantized "
                         "one's pruned copy keeps its format)")


def _quantized_copy(checkpoint: Checkpoint, out: Path, block: tuple[int, int], verify: bool, progress: bool) -> int:
    """Write ``checkpoint``'s weights, shard index and config.json, FP8 block-scaled, into directory ``out``
    (verified when ``verify``); returns how many tensors were quantized."""
    chosen = fp8_weight_keys(Skeleton(checkpoint, mtp=True))
    out.mkdir(exist_ok=True)
    weight_map, total = {}, 0
    for file in tqdm(checkpoint.files, desc=f"quantizing {checkpoint.path.name}", unit="shard", leave=False,
                     disable=not progress):
        sizes = _write_shard(checkpoint, file, chosen, block, out)
        weight_map.update({name: file.name for name in sizes})
        total += sum(sizes.values())
    if checkpoint.sharded:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / SAFE_INDEX).write_text(json.dumps(index, indent=2) + "\n")
    config = dict(checkpoint.raw_config)
    config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                     "weight_block_size": list(block)}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if verify:
        _verify(checkpoint, out, chosen, block, progress)
    return len(chosen)


def _write_shard(checkpoint: Checkpoint, file: Path, chosen: set[str], block: tuple[int, int],
                 out: Path) -> dict[str, int]:
    """One output shard: the chosen keys as (values, scales), the rest as stored; {key: bytes}."""
    entries = []
    for key in checkpoint.keys_in(file):
        shape = checkpoint.shape(key)
        if key in chosen:
            grid = (-(-shape[0] // block[0]), -(-shape[1] // block[1]))
            entries += [(key, torch.float8_e4m3fn, shape), (key + _SCALE, torch.float32, grid)]
        else:
            entries.append((key, checkpoint.dtype(key), shape))
    where = f"quantize_checkpoint of {str(checkpoint.path)!r}"
    with SafetensorsWriter(out / file.name, entries, metadata=checkpoint.metadata.get(file.name)) as writer:
        for key in checkpoint.keys_in(file):
            tensor = checkpoint.tensor(key)
            if tensor.is_floating_point():
                check_written_finite(repr(key), tensor, where)
            if key in chosen:
                values, scale = quantize_fp8_blocks(tensor, block)
                writer.write(key, values)
                writer.write(key + _SCALE, scale)
            else:
                writer.write(key, tensor)
    return {name: torch.empty((), dtype=dtype).element_size() * int(torch.Size(shape).numel())
            for name, dtype, shape in entries}


def _verify(source: Checkpoint, tmp: Path, chosen: set[str], block: tuple[int, int], progress: bool) -> None:
    """Every quantized tensor of the staged output within float8's rounding of its source, every other one equal."""
    with Checkpoint(tmp) as written:
        for key in tqdm(source.keys(), desc="verifying", unit="tensor", leave=False, disable=not progress):
            expected = source.tensor(key)
            if key not in chosen:
                if not torch.equal(written.tensor(key), expected):
                    raise ValueError(f"quantize_checkpoint: {key!r} was written changed; nothing was written")
                continue
            scale = written.stored_tensor(key + _SCALE)
            got = dequantize_fp8_blocks(written.stored_tensor(key), scale, block, torch.float32)
            rows, cols = got.shape
            spread = scale.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
            bound = expected.float().abs() * 2.0 ** -4 + scale_factors(spread) * 2.0 ** -10
            worst = ((got - expected.float()).abs() - bound).max()
            if worst > 0:
                raise ValueError(f"quantize_checkpoint: {key!r} dequantizes {worst.item():.3g} past float8's rounding "
                                 "of its source; nothing was written")

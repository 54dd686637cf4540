"""What [`convert_to_gguf`][..convert.convert_to_gguf] checks of the export before the converter runs: the output's
place (`check_placement`), a width-pruned export refused (`refuse_width`), the weight files as the
converter sees them (`converter_weight_files`, `check_weight_files`), and the export read as every path
reads a checkpoint, with one expert count for every layer (`checked_export`, `expert_counts`)."""

from __future__ import annotations

import os
from pathlib import Path

from lightprune.checkpoints.directory import SAFE_INDEX, shard_name, weight_files
from lightprune.checkpoints.reader import Checkpoint
from lightprune.checkpoints.skeleton import EXPERT_INDEX, Skeleton
from lightprune.core.errors import listed_text
from lightprune.core.jsonio import layer_items, read_json, show
from lightprune.export.result import EXPERT_FORMAT, MANIFEST_FILE, WIDTH_FORMAT
from lightprune.export.width_format import WIDTH_PLAN_FILE

__all__ = ["check_placement", "expert_counts", "refuse_width", "checked_export", "converter_weight_files",
           "check_weight_files"]

_UNIFORM_HINT = ("Prune with a uniform allocation (ExpertPruning(..., allocation='uniform'), lp.select_experts(..., "
                 "allocation='uniform')) for llama.cpp, or serve this export with transformers")


def check_placement(export: Path, outfile: str | os.PathLike) -> None:
    """Refuse an output that is the export, holds it or lies inside it (symlinks resolved), and an output file name
    (as given: the staged file's name is built from it) holding a brace."""
    src, out = export.resolve(), Path(outfile).expanduser().absolute().resolve()
    if out == src or out in src.parents or src in out.parents:
        where = "is" if out == src else "holds" if out in src.parents else "is inside"
        raise ValueError(f"refusing to write the GGUF to {os.fspath(outfile)!r}: it {where} the export {str(src)!r}, "
                         "whose files it would replace or mix with; choose a path outside the export")
    name = Path(outfile).expanduser().absolute().name  # a link's own name: the GGUF replaces the link
    if "{" in name or "}" in name:
        raise ValueError(f"output file name {name!r} holds '{{' or '}}', which llama.cpp's converter fills in "
                         "as a template; name the file as it should be written")


def _stored_experts(skeleton: Skeleton, prefix: str) -> set[int]:
    """The expert counts the checkpoint's tensors under the experts module ``prefix`` store: the expert indices
    of per-expert tensors, the first dimension of fused ones (one count when they agree)."""
    checkpoint, ids, counts = skeleton.checkpoint, set(), set()
    for target, keys in skeleton.sources.items():
        if not target.startswith(prefix):
            continue
        head = target[len(prefix):].split(".", 1)[0]
        if head.isdigit():  # an nn.ModuleList of experts
            ids.add(int(head))
            continue
        pieces = skeleton.merged_pieces(target)
        if pieces is not None:
            ids.update(index for by_expert in pieces.values() for index in by_expert)
            continue
        for key in keys:
            match = EXPERT_INDEX.search(key)
            if match is not None:
                ids.add(int(match.group(1)))
            elif checkpoint.shape(key):
                counts.add(checkpoint.shape(key)[0])
    return counts | ({len(ids)} if ids else set())


def expert_counts(skeleton: Skeleton) -> dict[int, int]:
    """{MoE layer: routed experts} of a checkpoint, counted in its weights and checked against config.json
    (``ValueError`` naming the layers where they differ); {} for a model of no family lightprune knows."""
    from lightprune.models import find_moe_layers, get_family

    try:
        get_family(skeleton.model)
        layers = find_moe_layers(skeleton.model)
    except ValueError:
        return {}
    names = {id(module): name for name, module in skeleton.model.named_modules()}
    counts, differ = {}, []
    for layer in layers:
        stored = _stored_experts(skeleton, names[id(layer.experts)] + ".")
        counts[layer.index] = next(iter(stored)) if len(stored) == 1 else layer.num_experts
        if stored and stored != {layer.num_experts}:
            differ.append(f"layer {layer.index}: {layer.num_experts} in config.json, {sorted(stored)} in the weights")
    if differ:
        raise ValueError(f"checkpoint {str(skeleton.checkpoint.path)!r}: config.json and the weights disagree on the "
                         f"experts per layer ({listed_text(differ)}); re-export it or restore the files")
    return counts


def _check_manifest(export: Path, counts: dict[int, int]) -> None:
    """``lightprune_export.json``, when there, must say what the weights hold (a width export is refused)."""
    file = export / MANIFEST_FILE
    if not os.path.lexists(file):
        return
    record = read_json(file, "export manifest")
    fix = "restore it, or delete it to convert the weights as they are"
    if not isinstance(record, dict):
        raise ValueError(f"export manifest file {str(file)!r} is not a JSON object; {fix}")
    if record.get("format") == WIDTH_FORMAT:
        refuse_width(export)
    if record.get("format") != EXPERT_FORMAT:
        raise ValueError(f"export manifest file {str(file)!r} has format {show(record.get('format'))}, not "
                         f"{EXPERT_FORMAT!r}; {fix}")
    said = {layer: n for _, layer, n in layer_items(record.get("experts_per_layer"), f"{file}'s experts_per_layer",
                                                    "{layer: routed experts}")}
    uniform = record.get("uniform")
    if said != counts or uniform is not (len(set(counts.values())) <= 1):
        raise ValueError(f"export manifest file {str(file)!r} says experts per layer {said} (uniform: {show(uniform)})"
                         f", the weights and config.json hold {counts}: the manifest was edited or belongs to "
                         f"another export; {fix}")


def refuse_width(export: Path) -> None:
    raise ValueError(f"export {str(export)!r} is width-pruned ({WIDTH_PLAN_FILE}): it computes with lightprune's "
                     "path-sparse kernels (lp.load_pruned), which GGUF cannot express; convert an expert-pruned export")


def checked_export(export: Path) -> dict[int, int]:
    """Open ``export`` as every path opens a checkpoint; its experts per layer, refused unless uniform."""
    with Checkpoint(export) as checkpoint:
        counts = expert_counts(Skeleton(checkpoint))
    if len(set(counts.values())) > 1:
        raise ValueError(f"export {str(export)!r} keeps different numbers of experts per layer ({counts}); GGUF "
                         f"stores one expert count for the whole model, so llama.cpp cannot load it. {_UNIFORM_HINT}")
    _check_manifest(export, counts)
    return counts


# ---------------------------------------------------------------------------------------------- its weight files
#: (prefix, suffix, index) of the weight files the converter reads (its ``ModelBase.index_tensors``), safetensors
#: first: pickles only in a folder without either
_CONVERTER_PARTS = (("model", ".safetensors", SAFE_INDEX), ("pytorch_model", ".bin", "pytorch_model.bin.index.json"))


def converter_weight_files(export: str | os.PathLike) -> list[str]:
    """The names of the weight files llama.cpp's converter reads in ``export``, as its ``index_tensors`` picks them:
    the files ``model.safetensors.index.json`` names when it is there (a leading ``./`` dropped, as
    `read_index` drops it: the converter joins the name to the folder), else
    every entry ``model*.safetensors``; in a folder without either, the same of ``pytorch_model.bin.index.json`` and
    ``pytorch_model*.bin``. Sorted."""
    export = Path(export)
    names = os.listdir(export)
    for prefix, suffix, index in _CONVERTER_PARTS:
        parts = sorted(name for name in names if name.startswith(prefix) and name.endswith(suffix))
        if (export / index).is_file():
            record = read_json(export / index, "shard index")
            weight_map = record.get("weight_map") if isinstance(record, dict) else None
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise ValueError(f"shard index file {str(export / index)!r} has no \"weight_map\" object {{tensor "
                                 "name: file name}, which llama.cpp's converter reads; restore it")
            return sorted({shard_name(value) for value in weight_map.values()})
        if parts:
            return parts
    return []


def check_weight_files(export: Path) -> None:
    """Refuse a file the converter would read that is not one of the checkpoint's weight files (a backup, a stray
    shard): it would convert its tensors too."""
    own = sorted(path.name for path in weight_files(export))
    stray = [name for name in converter_weight_files(export) if name not in own]
    if stray:
        raise ValueError(f"export {str(export)!r} holds {listed_text(stray)} beside its weights ({listed_text(own)}): "
                         f"llama.cpp's converter reads every model*.safetensors of a folder without {SAFE_INDEX} "
                         "and would convert those tensors too (a KeyError, or another file's weights in the GGUF); "
                         "move them out of the export")

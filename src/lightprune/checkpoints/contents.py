"""A checkpoint's tensors against the model that will hold them, before any tensor is read:
`check_contents`, run by every [`Skeleton`][..skeleton.Skeleton] (so by every streamed
path) and by [`load_pruned`][lightprune.export.load.load_pruned] before transformers loads anything, with the same
messages.

From the headers and the model built on the meta device, through transformers' own key mapping (renamings,
per-expert tensors fused into ``gate_up_proj`` / ``down_proj``):

- every tensor the model needs is on disk (tied weights follow their source; the patterns the model's class
  lists in ``_keys_to_ignore_on_load_missing`` are left out, as transformers does);
- nothing is on disk that the model has no tensor for, bar the class's ``_keys_to_ignore_on_load_unexpected``
  (a DeepSeek-V3 multi-token-prediction layer) and the legacy rotary ``inv_freq`` / ``position_ids`` buffers
  transformers ignores: a config claiming fewer layers or experts than the weights hold is refused here;
- every tensor the model reads as it is has the model's shape; per-expert tensors on disk can be fused (every
  expert of a layer has every name, in one shape: `strict.expert_layout_error`) and those of a fused
  tensor cover experts ``0 .. n-1`` (n its first dimension, from the config's expert count) in pieces that fit;
- no integer or bool tensor where the model's tensor is floating (or where it has none);
- a model of a supported family has MoE layers, and each routes ``1 <= top_k <= num_experts`` experts per token
  and has no zero-size expert tensor (``moe_intermediate_size: 0``), the config field named.

Each refusal is one ``ValueError`` naming the checkpoint and the tensors (at most 8, then "and N more").
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from lightprune.checkpoints.mtp import mtp_prefixes
from lightprune.checkpoints.strict import check_loading_info, expert_layout_error, tensors_phrase
from lightprune.core.errors import listed_text

#: a :class:`~lightprune.checkpoints.skeleton.Skeleton` (which imports this module, so not imported here)
Skeleton = Any

__all__ = ["check_contents", "is_integer_dtype"]

_FLOAT_ONLY = "lightprune loads float checkpoints; quantized or integer weights are not supported"


def is_integer_dtype(name: str) -> bool:
    """A safetensors dtype name (``F32``, ``BF16``, ``F8_E4M3``, ``I8``, ``U8``, ``BOOL``, ...) that is not
    floating point."""
    return not (name.startswith("F") or name == "BF16")


def _integer_tensors(skeleton: Skeleton, own: dict[str, Any]) -> list[str]:
    checkpoint, bad = skeleton.checkpoint, []
    for key in checkpoint.keys():
        name = checkpoint.dtype_name(key)
        if not is_integer_dtype(name):
            continue
        target = skeleton.targets.get(key, (None, None))[0]
        tensor = own.get(target)
        if tensor is not None and not tensor.is_floating_point():
            continue
        role = (f"the model's {target} is {str(tensor.dtype).removeprefix('torch.')}" if tensor is not None
                else "the model has no integer tensor of that name")
        bad.append(f"{key}: {name} in {checkpoint.file(key).name}, {role}")
    return sorted(bad)


def _mismatched(skeleton: Skeleton, own: dict[str, Any]) -> tuple[list[tuple[str, list, list]], list[str]]:
    """(model tensors whose disk shape differs, as transformers' report lists them; per-expert problems)."""
    checkpoint, shapes, experts = skeleton.checkpoint, [], []
    for target, keys in sorted(skeleton.sources.items()):
        want = tuple(own[target].shape)
        patterns = [skeleton.targets[key][1] for key in keys]
        if patterns == [None]:
            if checkpoint.shape(keys[0]) != want:
                shapes.append((target, list(checkpoint.shape(keys[0])), list(want)))
            continue
        pieces = skeleton.merged_pieces(target)
        if pieces is None:  # another conversion: transformers' own, checked when it runs
            continue
        width = 0
        for pattern, by_expert in pieces.items():
            if len(by_expert) != want[0] or min(by_expert) != 0 or max(by_expert) != want[0] - 1:  # ids are unique
                found = sorted(by_expert)
                experts.append(f"{target} needs experts 0..{want[0] - 1} of {pattern}, the checkpoint has "
                               f"{found if len(found) <= 8 else f'{len(found)} ids from {found[0]} to {found[-1]}'}")
                continue
            rows = {checkpoint.shape(key) for key in by_expert.values()}
            if len(rows) != 1 or len(next(iter(rows))) != len(want) - 1 or next(iter(rows))[1:] != want[2:]:
                experts.append(f"{pattern}: per-expert shapes {sorted(map(list, rows))} do not fit {target} "
                               f"{list(want)}")
                continue
            width += next(iter(rows))[0]
        if not experts and width != want[1]:
            shapes.append((target, [want[0], width, *want[2:]], list(want)))
    return shapes, experts


def check_contents(skeleton: Skeleton) -> None:
    """Raise ``ValueError`` for anything of the module docstring's list."""
    checkpoint, model = skeleton.checkpoint, skeleton.model
    path = checkpoint.path
    own = model.state_dict(keep_vars=True)
    integers = _integer_tensors(skeleton, own)
    if integers:
        raise ValueError(f"checkpoint {str(path)!r} stores {tensors_phrase(len(integers))} as integers "
                         f"({listed_text(integers)}; tensor names as stored in the safetensors files): {_FLOAT_ONLY}")
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    info = SimpleNamespace(missing_keys={name for name in own if name not in skeleton.sources and name not in tied},
                           unexpected_keys={skeleton.renamed.get(key, key) for key in skeleton.unmatched})
    model._adjust_missing_and_unexpected_keys(info)  # transformers' own exceptions (its ignore patterns)
    # a multi-token-prediction layer's tensors (:mod:`lightprune.checkpoints.mtp`): copied, or pruned when built
    mtp = mtp_prefixes(skeleton.mtp_layers, getattr(skeleton.checkpoint.config, "num_hidden_layers", 0))
    unexpected = sorted(key for key in skeleton.unmatched if skeleton.renamed.get(key, key) in info.unexpected_keys
                        and not key.startswith(mtp))
    shapes, experts = _mismatched(skeleton, own)
    layout_error = expert_layout_error(path, checkpoint.entries())
    if experts:  # a fused tensor with some of its pieces: the pieces on disk say what is wrong
        raise layout_error or ValueError(
            f"checkpoint {str(path)!r}: its per-expert tensors do not fit the model's fused parameters "
            f"({listed_text(experts)}; the expert count comes from config.json); re-export it or restore the files")
    check_loading_info(path, {"missing_keys": sorted(info.missing_keys), "unexpected_keys": unexpected,
                              "mismatched_keys": shapes, "error_msgs": []})
    if layout_error is not None:
        raise layout_error
    _check_routing(skeleton)


def _check_routing(skeleton: Skeleton) -> None:
    """Every MoE layer prunable (`lightprune.models.layer_shapes.layer_problems`: routed experts, top-k
    against the expert count, no zero-size expert tensor); a model of no supported MoE family: nothing to check
    (what prunes it refuses it)."""
    from lightprune.models import get_family
    from lightprune.models.layer_shapes import describe, layer_problems, zero_experts_field

    try:
        family = get_family(skeleton.model)
    except ValueError:
        return
    layers, path = family.layers(), str(skeleton.checkpoint.path)
    if not layers:
        raise ValueError(f"checkpoint {path!r}: {type(skeleton.model).__name__} has no MoE layers"
                         f"{zero_experts_field(family)}: nothing to prune")
    problems = layer_problems(layers)
    if problems:
        raise ValueError(f"checkpoint {path!r} cannot be pruned: {describe(problems)} (tensor names are the "
                         "model's); fix config.json or re-export it")

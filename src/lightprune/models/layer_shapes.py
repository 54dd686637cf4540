"""What makes a MoE layer prunable at all, checked where a model is first examined (`layer_problems`):

- at least one routed expert (the router has a row per expert);
- ``1 <= top_k <= num_experts``;
- no zero-size expert or router tensor (``moe_intermediate_size: 0``, ``hidden_size: 0``): torch's grouped matmul
  fails on one with "strides should be multiple of 16 bytes", and an empty expert has nothing to score.

Each problem names the layer, the tensor or count and the config field that set it, so that
[`lightprune.models.find_moe_layers`][..find_moe_layers] (a model in memory) and the checkpoint reader
(`lightprune.checkpoints.contents.check_contents`, naming the checkpoint) refuse with the same words.
"""

from __future__ import annotations

from typing import Any

from lightprune.models.layer import MoELayer, config_value

__all__ = ["describe", "layer_problems", "zero_experts_field"]

#: config keys a family reads its experts-per-token from (the one naming the bad value is quoted)
_TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "moe_top_k", "top_k", "experts_per_token", "num_selected_experts",
               "moe_k", "n_activated_experts")


def _fields(config: Any, value: int, keys: tuple[str, ...] | None = None, suffix: str = "") -> str:
    """`` (config a: v, b: v)`` for the int fields of ``config`` equal to ``value`` among ``keys`` (or, with
    ``suffix``, every field whose name ends with it); "" when none is."""
    found = [key for key, v in sorted(vars(config).items()) if isinstance(v, int) and not isinstance(v, bool)
             and v == value and (key in keys if keys is not None else key.endswith(suffix))]
    return f" (config {', '.join(f'{key}: {value}' for key in found)})" if found else ""


def _more(count: int, what: str) -> str:
    return f"{count} more {what}{'s' if count > 1 else ''}"


def _shape(tensor: Any) -> tuple[int, ...]:
    """The full shape of a parameter or buffer (a DeepSpeed ZeRO-3 partition's ``ds_shape``)."""
    return tuple(getattr(tensor, "ds_shape", None) or tensor.shape)


def _tensors(layer: MoELayer) -> list[tuple[str, tuple[int, ...]]]:
    """(name in the model, shape) of every parameter and buffer of the layer's experts and of its router."""
    paths = {id(module): path for path, module in layer.block.named_modules(remove_duplicate=False)}
    found = {}
    for module in (layer.experts, layer.router):
        base = ".".join(part for part in (layer.name, paths.get(id(module), "")) if part)
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            found.setdefault(f"{base}.{name}", _shape(tensor))
    return list(found.items())


def layer_problems(layers: list[MoELayer]) -> list[str]:
    """One phrase per layer that cannot be pruned (see the module docstring), in depth order; [] when none."""
    problems = []
    for layer in layers:
        family = layer.family
        config = family.text_config if family is not None else None
        count = _fields(config, layer.num_experts, (family.num_experts_key,)) if config is not None else ""
        top_k = _fields(config, layer.top_k, _TOP_K_KEYS) if config is not None else ""
        empty = [f"{name} {list(shape)}" for name, shape in _tensors(layer) if 0 in shape]
        if layer.num_experts < 1:
            problems.append(f"layer {layer.index}: {layer.num_experts} routed experts{count}")
        elif not 1 <= layer.top_k <= layer.num_experts:
            problems.append(f"layer {layer.index}: top_k {layer.top_k} of {layer.num_experts} experts{top_k}")
        elif empty:
            sizes = _fields(config, 0, suffix="size") if config is not None else ""
            problems.append(f"layer {layer.index}: zero-size expert tensor {empty[0]}{sizes}"
                            + (f" and {_more(len(empty) - 1, 'tensor')}" if len(empty) > 1 else ""))
    return problems


def describe(problems: list[str]) -> str:
    """`layer_problems`' phrases for one line (the first, then how many more layers), and the rule."""
    shown = problems[0] + (f", and {_more(len(problems) - 1, 'layer')}" if len(problems) > 1 else "")
    return (f"{shown}; a MoE layer needs routed experts, 1 <= top_k <= its experts and no zero-size expert "
            "tensor")


def zero_experts_field(family: Any) -> str:
    """`` (config <key>: <n>)`` when the config gives the routed experts a count of 0 or less (the family builds
    dense layers then), else ""."""
    value = config_value(family.text_config, family.num_experts_key)
    if isinstance(value, int) and not isinstance(value, bool) and value <= 0:
        return f" (config {family.num_experts_key}: {value})"
    return ""

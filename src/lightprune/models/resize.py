"""Resize the routed-expert slots of a transformers MoE model per layer, with torch alone.

A non-uniformly pruned checkpoint keeps a different number of routed experts in each MoE layer,
which no stock transformers class can build from its config. The config records the counts as
``lightprune_experts_per_layer = {"<layer index>": count}`` (the family's own count key holds the
largest); this module turns a model built with that largest count into the pruned architecture,
with empty slots that ``from_pretrained`` then fills from the checkpoint.

This module is the single implementation of that resize. lightprune's in-process loader imports
it, and ``save_pruned`` copies its source verbatim into the ``modeling_lightprune.py`` written
beside a non-uniform checkpoint (for ``trust_remote_code=True``), so it must import nothing but
torch: no lightprune, no third-party package.

A block is found by a path pattern such as ``"model.layers.{index}.mlp"``; inside it the router and
experts modules by attribute name. Per-expert tensors (dimension 0 indexes experts) get ``count``
empty rows, parameters stay parameters, buffers keep their persistence; every integer
``num_experts`` attribute of the router, the experts module and the block follows.
"""

import torch
from torch import nn

__all__ = ["PER_LAYER_KEY", "EXPERT_TENSORS", "ROUTER_TENSORS", "block_path", "experts_per_layer", "resize_rows",
           "resize_block", "resize_model", "router_sub_tensors"]

#: config key (on the top-level config) of the per-layer routed-expert counts
PER_LAYER_KEY = "lightprune_experts_per_layer"
#: per-expert tensors of a fused experts module
EXPERT_TENSORS = ("gate_up_proj", "down_proj", "up_proj", "gate_up_proj_bias", "down_proj_bias", "up_proj_bias")
#: per-expert tensors of a router
ROUTER_TENSORS = ("weight", "bias", "e_score_correction_bias")
def router_sub_tensors(router, specs):
    """``[(module, name, dim)]`` of the per-expert tensors in ``router``'s submodules that exist; ``specs`` are
    the family's ``(submodule, name, experts' dimension)``, submodule "" the router itself, a dotted path a nested one
    (ERNIE-4.5: its selection bias ``moe_statics.e_score_correction_bias`` [1, E]; Gemma 4: ``proj.weight`` [E, H]
    and ``per_expert_scale`` [E]; Ergo: ``experts.post_expert_norm.weight`` [E, H], from its MoE block)."""
    found = []
    for sub, name, dim in specs:
        module = router
        for part in sub.split(".") if sub else ():  # a dotted path: a submodule's submodule (Ergo's
            module = getattr(module, part, None)    # experts.post_expert_norm)
        if isinstance(module, nn.Module) and isinstance(getattr(module, name, None), torch.Tensor):
            found.append((module, name, dim))
    return found


def _replace(module, name, data, like):
    if isinstance(like, nn.Parameter):
        setattr(module, name, nn.Parameter(data, requires_grad=like.requires_grad))
    else:
        persistent = _persistent(module, name)
        delattr(module, name)
        module.register_buffer(name, data, persistent=persistent)


def block_path(pattern, index):
    """The module path of MoE block ``index`` given a pattern with an ``{index}`` field."""
    if "{index}" not in pattern:
        raise ValueError(f"MoE block pattern {pattern!r} has no {{index}} field")
    return pattern.replace("{index}", str(int(index)))


def experts_per_layer(config):
    """``{layer index: count}`` from ``config``'s per-layer key, or None when the config has none."""
    counts = getattr(config, PER_LAYER_KEY, None)
    if counts is None:
        return None
    if not isinstance(counts, dict) or not counts:
        raise ValueError(f"config.{PER_LAYER_KEY} must be a non-empty {{layer: count}} mapping, got {counts!r}")
    parsed = {}
    for key, value in counts.items():
        try:
            index, count = int(key), int(value)
        except (TypeError, ValueError):
            raise ValueError(f"config.{PER_LAYER_KEY} has a bad entry {key!r}: {value!r}") from None
        if index < 0 or count < 1 or count != value:
            raise ValueError(f"config.{PER_LAYER_KEY} has a bad entry {key!r}: {value!r}")
        parsed[index] = count
    return dict(sorted(parsed.items()))


def _persistent(module, name):
    return name in module._buffers and name not in module._non_persistent_buffers_set


def resize_rows(module, names, count):
    """Replace each named tensor of ``module`` that exists with an empty one of ``count`` rows."""
    for name in names:
        tensor = getattr(module, name, None)
        if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
            continue
        _replace(module, name, torch.empty((count, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device),
                 tensor)


def resize_block(block, router_attr, experts_attr, count, router_sub=(), router_weight="", block_sub=(),
                 identity=0, expert_sub=(), rows=1):
    """Give one MoE ``block`` ``count`` empty routed-expert slots (router rows, expert tensors and the per-expert
    tensors ``router_sub`` names in the router's submodules); ``router_weight`` names the router's submodule that
    holds ``weight [E, H]`` ("": the router itself; Gemma 4: "proj"); ``block_sub`` the block's own per-expert
    tensors as (submodule, name, dim), "" the block itself (MiniMax-M2's ``e_score_correction_bias``). ``identity``:
    zero-computation experts whose router rows follow the routed ones (LongCat-Flash): the router's tensors get
    ``count + identity`` rows, its ``n_routed_experts`` that count and the block's ``num_routed_experts`` ``count``.
    ``expert_sub``: the experts' per-expert tensors as (submodule, name) where they are not `EXPERT_TENSORS`,
    ``rows`` rows per expert one after another (DBRX's ``mlp.w1`` [E * I, H]): they get ``count * rows`` rows."""
    router = getattr(block, router_attr, None)
    experts = getattr(block, experts_attr, None)
    if router is None or experts is None:
        raise ValueError(f"{type(block).__name__} has no {router_attr!r} router or no {experts_attr!r} experts")
    linear = getattr(router, router_weight) if router_weight else router
    resize_rows(linear, ROUTER_TENSORS, count + identity)
    if expert_sub:
        for sub, name in expert_sub:
            resize_rows(experts.get_submodule(sub), (name,), count * rows)
    else:
        resize_rows(experts, EXPERT_TENSORS, count)
    routing = router_sub_tensors(router, router_sub)
    for module, name, dim in routing + router_sub_tensors(block, block_sub):
        tensor = getattr(module, name)
        shape = list(tensor.shape)
        shape[dim] = count + identity if (module, name, dim) in routing else count
        _replace(module, name, torch.empty(shape, dtype=tensor.dtype, device=tensor.device), tensor)
    for module in (router, linear, experts, block):
        if isinstance(getattr(module, "num_experts", None), int):
            module.num_experts = int(count)
    if identity:
        for module, attr, value in ((router, "n_routed_experts", count + identity),
                                    (block, "num_routed_experts", count)):
            if isinstance(getattr(module, attr, None), int):
                setattr(module, attr, int(value))


def resize_model(model, pattern, counts, router_attr, experts_attr, router_sub=(), router_weight="", block_sub=(),
                 identity=0, expert_sub=(), rows=1):
    """Resize every MoE block named by ``pattern`` and ``counts`` (``{layer index: count}``), each with ``identity``
    zero-computation experts and its experts' tensors ``expert_sub`` (`resize_block`); returns ``model``."""
    for index, count in sorted(counts.items()):
        path = block_path(pattern, index)
        try:
            block = model.get_submodule(path)
        except AttributeError:
            raise ValueError(f"{type(model).__name__} has no MoE block {path!r} for layer {index} "
                             f"(config.{PER_LAYER_KEY} names it)") from None
        resize_block(block, router_attr, experts_attr, int(count), router_sub, router_weight, block_sub, identity,
                     expert_sub, rows)
    return model

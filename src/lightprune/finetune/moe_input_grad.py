"""MoE blocks' inputs given a gradient while an adapter trains, for DeepSpeed ZeRO-3.

Under DeepSpeed ZeRO-3 a Mixtral / Qwen2-MoE / Qwen3-MoE sparse block is a "leaf" module (DeepSpeed's
default ``zero_optimization.leaf_module`` classes): its parameters are gathered for the whole block, and their
gradients are reduced (a missing one as zero: an expert no token reached) in a full backward hook on the block.
When no input of the block requires grad (every layer below the first MoE block frozen, as under a router
LoRA), that hook fires as soon as the block's output gradient arrives, before autograd has reached the
adapter's parameters inside the block; their real gradients then meet released partitions and backward fails.
So every adapter ([`lightprune.finetune.adapters.apply_adapter`][..adapters.apply_adapter]) gives the input of each MoE
block a gradient where it has none: a detached copy that requires grad (a forward pre-hook, `moe_inputs_require_grad`;
values, and so parameter gradients, unchanged);
[`lightprune.finetune.adapters.remove_adapters`][..adapters.remove_adapters] removes the hooks.
"""

from __future__ import annotations

import torch
from torch import nn

from lightprune.models import find_moe_layers
from lightprune.models.unwrap import base_model_of

__all__ = ["moe_inputs_require_grad"]


def _input_with_grad(module: nn.Module, args: tuple) -> tuple | None:
    """Forward pre-hook: a floating-point first input without grad becomes a detached copy that requires grad."""
    if not torch.is_grad_enabled() or not args:
        return None
    x = args[0]
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.requires_grad:
        return None
    return (x.detach().requires_grad_(True), *args[1:])


def moe_inputs_require_grad(model: nn.Module, enable: bool = True) -> None:
    """Give the input of every MoE block of ``model`` a gradient while training (``enable=False``: stop).

    What DeepSpeed ZeRO-3 needs to reduce the gradients of an adapter inside a "leaf" MoE block (see the module
    docstring). A no-op for a block whose input already requires grad, under ``torch.no_grad``, and for a model
    without MoE layers (a dense MLLM).
    """
    try:
        layers = find_moe_layers(base_model_of(model))
    except ValueError:  # not an MoE model of a supported family: no MoE block to reach
        return
    for layer in layers:
        hooks = layer.block._forward_pre_hooks
        for key in [k for k, hook in hooks.items() if hook is _input_with_grad]:
            del hooks[key]
        if enable:
            layer.block.register_forward_pre_hook(_input_with_grad)

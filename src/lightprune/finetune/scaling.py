"""IA3 scaling where peft cannot reach: the router input and the fused experts (router sensitivity ("Router
Sensitivity Under Lightweight Fine-Tuning Identifies Prunable Experts in Mixture-of-Experts Models", arXiv
2608.07890), section 3.3).

IA3 (Liu et al. 2022) learns a per-channel vector ``a`` and replaces an input ``x`` by ``x * a``. For the
router, router sensitivity section 3.3 writes the logits as ``l(x) = W_g (x * a)``. Because the router is linear,
``W_g (x * a) = (W_g diag(a)) x``: scaling the router input is exactly scaling the *columns* of the router
weight. We implement it as a torch parametrization of ``router.weight`` (``weight = original * a``), so that

- every way of computing router logits (the block's own forward, ``MoELayer.route``, the family adapter's
  ``router_logits``) sees the scaled input, and the experts still receive the unscaled hidden states;
- the router weight itself (``router.parametrizations.weight.original``) stays frozen: only ``a`` trains.

For the fused experts, IA3's feed-forward vector scales the input of the down projection (the gated
activation, width ``I``). With ``down_proj [E, H, I]`` that is scaling its last axis, one vector per expert
(``a [E, 1, I]``, like one IA3 vector per expert module in a per-expert checkpoint). The attention projections
are handled by peft's IA3 (see [`lightprune.finetune.apply_adapter`][..adapters.apply_adapter]).

All vectors start at one, so an un-trained IA3 model computes exactly what the base model computes.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize

__all__ = ["ChannelScale", "scale_parameter_input", "remove_channel_scales", "has_channel_scales"]


class ChannelScale(nn.Module):
    """Parametrization ``weight -> weight * scale`` with ``scale`` broadcast over the input axis (last axis)."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(shape, dtype=dtype, device=device))

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * self.scale.to(weight.dtype)


def scale_parameter_input(module: nn.Module, name: str, per_expert: bool = False) -> ChannelScale:
    """Scale the input channels (last axis) of ``module.<name>`` by a trainable vector starting at one.

    ``per_expert``: for a 3D fused expert parameter ``[E, out, in]``, one vector per expert (``[E, 1, in]``);
    otherwise one vector shared by all rows (``[in]``). The original parameter keeps its ``requires_grad``.
    """
    param = getattr(module, name)
    if per_expert:
        if param.dim() != 3:
            raise ValueError(f"per_expert scaling needs a 3D [E, out, in] parameter, {name} has shape "
                             f"{tuple(param.shape)}")
        shape = (param.shape[0], 1, param.shape[-1])
    else:
        shape = (param.shape[-1],)
    dtype = param.dtype if param.dtype.is_floating_point else torch.float32
    scale = ChannelScale(shape, dtype, param.device)
    requires_grad = param.requires_grad
    parametrize.register_parametrization(module, name, scale, unsafe=True)
    module.parametrizations[name].original.requires_grad_(requires_grad)
    return scale


def has_channel_scales(model: nn.Module) -> bool:
    return any(isinstance(m, ChannelScale) for m in model.modules())


def remove_channel_scales(model: nn.Module) -> nn.Module:
    """Drop every `ChannelScale` from ``model`` in place, restoring the original (unscaled) parameters."""
    for module in list(model.modules()):
        if not parametrize.is_parametrized(module):
            continue
        for name in list(module.parametrizations.keys()):
            plist = module.parametrizations[name]
            if any(isinstance(p, ChannelScale) for p in plist):
                if len(plist) != 1:
                    raise ValueError(f"{type(module).__name__}.{name} has other parametrizations besides the IA3 "
                                     "scale; remove those first")
                parametrize.remove_parametrizations(module, name, leave_parametrized=False)
    return model

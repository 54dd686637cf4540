"""Houlsby bottleneck adapters (Houlsby et al. 2019; router sensitivity ("Router Sensitivity Under Lightweight
Fine-Tuning Identifies Prunable Experts in Mixture-of-Experts Models", arXiv 2608.07890), section 3.3), which peft
does not provide.

An adapter maps a sublayer output ``h`` to ``h + U gelu(D LN(h))`` with ``D: hidden -> hidden // reduction``
and ``U: hidden // reduction -> hidden`` (router sensitivity section 3.3: ``x -> x + U sigma(D LN(x))``). ``U`` is
initialised to zero, so a freshly inserted adapter is the identity and the adapted model's logits equal the
base model's exactly until the first optimizer step.

Where: two adapters per decoder layer, as in Houlsby et al.: one on the output of the attention sublayer
(``layer.self_attn``) and one on the output of the MLP / MoE sublayer (``layer.mlp``), both *before* the
decoder layer's residual add. They are attached with forward hooks, so the model's module tree (and with it
[`lightprune.find_moe_layers`][lightprune.models.find_moe_layers], the routers and the experts) is unchanged; the
adapter modules live on
the decoder layer as ``houlsby_attn`` / ``houlsby_mlp`` so that they are parameters of the model (optimizer,
state_dict, device moves). The router of layer ``l`` sees ``LN(residual + attn + adapter(attn))``, so router
logits change through their input while every router weight stays frozen.
"""

from __future__ import annotations

import torch
from torch import nn

from lightprune.models import get_family

__all__ = ["HoulsbyAdapter", "insert_houlsby", "remove_houlsby", "has_houlsby"]

#: attribute names of the adapters on a decoder layer, keyed by the sublayer they follow
_SLOTS = {"self_attn": "houlsby_attn", "mlp": "houlsby_mlp"}


class HoulsbyAdapter(nn.Module):
    """``h -> h + U gelu(D LN(h))``, ``U`` zero-initialised.

    Args:
        hidden_size: width of the sublayer output.
        reduction: bottleneck width is ``max(1, hidden_size // reduction)``.
    """

    def __init__(self, hidden_size: int, reduction: int = 16):
        super().__init__()
        if hidden_size <= 0 or reduction <= 0:
            raise ValueError(f"hidden_size and reduction must be positive, got {hidden_size}, {reduction}")
        bottleneck = max(1, hidden_size // reduction)
        self.norm = nn.LayerNorm(hidden_size)
        self.down = nn.Linear(hidden_size, bottleneck)
        self.act = nn.GELU()
        self.up = nn.Linear(bottleneck, hidden_size)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)
        self._handle = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        delta = self.up(self.act(self.down(self.norm(hidden.to(self.down.weight.dtype)))))
        return hidden + delta.to(hidden.dtype)

    def hook(self, module: nn.Module, args, output):
        """Forward hook on the sublayer: adapt the hidden states of its output (first element of a tuple)."""
        if isinstance(output, tuple):
            return (self(output[0]), *output[1:])
        return self(output)


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    return get_family(model).decoder_layers()[1]


def _hidden_size(model: nn.Module) -> int:
    return int(get_family(model).text_config.hidden_size)


def insert_houlsby(model: nn.Module, reduction: int = 16) -> list[HoulsbyAdapter]:
    """Insert adapters after every decoder layer's attention and MLP/MoE sublayer; returns them.

    The new adapters take the dtype and device of the layer's first parameter and are trainable; nothing
    else is frozen here (see [`lightprune.finetune.apply_adapter`][...adapters.apply_adapter]).
    """
    if has_houlsby(model):
        raise ValueError("the model already has Houlsby adapters; remove them first (remove_houlsby)")
    hidden = _hidden_size(model)
    inserted: list[HoulsbyAdapter] = []
    for layer in _decoder_layers(model):
        ref = next(layer.parameters())
        for sub_name, slot in _SLOTS.items():
            sub = getattr(layer, sub_name, None)
            if sub is None:
                raise ValueError(f"{type(layer).__name__} has no {sub_name!r} sublayer to put a Houlsby adapter after")
            adapter = HoulsbyAdapter(hidden, reduction).to(device=ref.device, dtype=ref.dtype
                                                           if ref.dtype.is_floating_point else torch.float32)
            setattr(layer, slot, adapter)
            adapter._handle = sub.register_forward_hook(adapter.hook)
            inserted.append(adapter)
    return inserted


def has_houlsby(model: nn.Module) -> bool:
    return any(isinstance(m, HoulsbyAdapter) for m in model.modules())


def remove_houlsby(model: nn.Module) -> nn.Module:
    """Remove every Houlsby adapter (hooks and modules) from ``model`` in place; returns ``model``."""
    for module in list(model.modules()):
        for slot in _SLOTS.values():
            adapter = module._modules.get(slot)
            if isinstance(adapter, HoulsbyAdapter):
                if adapter._handle is not None:
                    adapter._handle.remove()
                    adapter._handle = None
                del module._modules[slot]
    return model

"""Width-pruning units of a model's language decoder (MWOP).

MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), section 3: every decoder layer l
has query heads h whose attention splits into paths b = (query modality -> key modality): V2V, T2V, T2T; every
dense FFN channel c has a visual and a text execution. [`find_width_layers`][] finds, for every layer of the
LANGUAGE model (the vision tower is never pruned), the attention module with its head counts and the FFN with its
channel count (``intermediate_size`` m; ``None`` for an MoE layer, whose FFN is experts).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from lightprune.models import FAMILIES, get_family
from lightprune.models.base import MoEFamily
from lightprune.models.unwrap import base_model_of

__all__ = ["WidthLayer", "find_width_layers", "vision_token_ids", "language_decoder"]

_DENSE_FFN = ("gate_proj", "up_proj", "down_proj")


@dataclass(eq=False)
class WidthLayer:
    """One decoder layer of the language model, in depth order (``index`` is the layer's position)."""

    index: int
    attention: nn.Module
    mlp: nn.Module
    #: the module the dense MLP calls on its gated activation (a peft LoRA wrapper when there is one)
    down_proj: nn.Module | None
    num_heads: int
    num_kv_heads: int
    head_dim: int
    #: dense FFN channels m; None for an MoE layer
    intermediate_size: int | None

    @property
    def is_moe(self) -> bool:
        return self.down_proj is None


def _transformers_model(model: nn.Module) -> nn.Module:
    return base_model_of(model)


def language_decoder(model: nn.Module) -> tuple[nn.Module, str, nn.ModuleList]:
    """(transformers model, module path, ModuleList) of the language model's decoder layers."""
    base = _transformers_model(model)
    # the base family's path search needs nothing family-specific
    path, decoder = MoEFamily(base).decoder_layers()
    return base, path, decoder


def _moe_indices(base: nn.Module) -> set[int]:
    if getattr(getattr(base, "config", None), "model_type", None) not in FAMILIES:
        return set()
    return {layer.index for layer in get_family(base).layers()}


def find_width_layers(model: nn.Module) -> list[WidthLayer]:
    """The language model's decoder layers with their attention and FFN width (works through peft
    wrappers and a LightningModule holding the model).

    A dense FFN is an ``mlp`` with ``gate_proj``, ``up_proj`` and ``down_proj``; an MoE FFN is what
    [`lightprune.models.find_moe_layers`][lightprune.models.find_moe_layers] reports for that layer. Anything else is an
    error.
    """
    base, path, decoder = language_decoder(model)
    moe = _moe_indices(base)
    layers = []
    for index, layer in enumerate(decoder):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attn is None or mlp is None:
            raise ValueError(f"{type(base).__name__} decoder layer {index} ({path}.{index}) has no self_attn "
                             f"and mlp modules; width pruning needs both")
        config = getattr(attn, "config", None)
        if config is None or not hasattr(config, "num_attention_heads"):
            raise ValueError(f"decoder layer {index}: self_attn ({type(attn).__name__}) has no config with "
                             f"num_attention_heads")
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(attn, "head_dim", None) or config.hidden_size // heads)
        if index in moe:
            down, size = None, None
        elif all(hasattr(mlp, name) for name in _DENSE_FFN):
            down = mlp.down_proj
            size = getattr(down, "in_features", None)
            if size is None:
                raise ValueError(f"decoder layer {index}: mlp.down_proj ({type(down).__name__}) has no in_features")
            size = int(size)
        else:
            raise ValueError(f"decoder layer {index}: mlp ({type(mlp).__name__}) is neither a dense gated FFN "
                             f"(gate_proj, up_proj, down_proj) nor an MoE block lightprune knows")
        layers.append(WidthLayer(index=index, attention=attn, mlp=mlp, down_proj=down, num_heads=heads,
                                 num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=size))
    if not layers:
        raise ValueError(f"{type(base).__name__} has no decoder layers")
    return layers


def vision_token_ids(model: nn.Module) -> set[int]:
    """The config's ``image_token_id`` / ``video_token_id`` (top-level or text config); an error naming
    the model when it has none (a text-only model has no vision paths)."""
    base = _transformers_model(model)
    config = getattr(base, "config", None)
    found: set[int] = set()
    for cfg in (config, getattr(config, "text_config", None)):
        for key in ("image_token_id", "video_token_id"):
            value = getattr(cfg, key, None) if cfg is not None else None
            if value is not None:
                found.add(int(value))
    if not found:
        raise ValueError(f"{type(base).__name__} (model_type {getattr(config, 'model_type', None)!r}) has no "
                         f"image_token_id / video_token_id in its config: no vision tokens to tell apart")
    return found

"""Which transformers classes build a pruned checkpoint, and the in-process resizing subclass.

- `auto_class_name`: ``AutoModelForImageTextToText`` for the MLLM families (the family's
  ``multimodal`` flag); otherwise ``AutoModelForCausalLM`` when transformers' causal-LM auto mapping has the
  config's model type, else ``AutoModelForImageTextToText`` when that mapping has it (Mistral 4: its
  ``Mistral4ForCausalLM`` is mapped only there), else an error naming the model type.
- `base_class`: the stock transformers class of a model or config (never a lightprune or
  remote-code subclass), the name a checkpoint records in ``architectures``.
- `moe_block_pattern`: the module path of the MoE blocks with an ``{index}`` field, from
  the family (``model.layers.{index}.mlp``, ``model.language_model.layers.{index}.mlp``).
- `resizing_class`: a subclass of the stock class whose ``__init__`` gives each layer the
  expert count of ``config.lightprune_experts_per_layer`` (through `resize`, the same
  code the generated ``modeling_lightprune.py`` runs), so ``from_pretrained`` loads a
  non-uniform checkpoint with its own weight conversions and never runs the checkpoint's code.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lightprune.models import resize as remote_resize
from lightprune.models import FAMILIES, find_moe_layers, get_family

__all__ = ["auto_class_name", "auto_class", "base_class", "base_class_for_config", "moe_block_pattern",
           "resizing_class"]

_CAUSAL, _IMAGE_TEXT = "AutoModelForCausalLM", "AutoModelForImageTextToText"
_RESIZING: dict[type, type] = {}


def _in_auto_mapping(config: Any, name: str) -> bool:
    """Whether the auto mapping ``name`` (e.g. ``MODEL_FOR_CAUSAL_LM_MAPPING``) has ``config``: by its model type
    (transformers' own table) or by its class (a config class registered with the auto class)."""
    from transformers.models.auto import modeling_auto

    if getattr(config, "model_type", None) in getattr(modeling_auto, f"{name}_NAMES"):
        return True
    try:
        return type(config) in getattr(modeling_auto, name)
    except (KeyError, AttributeError, TypeError):
        return False


def auto_class_name(config: Any) -> str:
    """The transformers auto class that builds ``config``'s model with its LM head: ``AutoModelForImageTextToText``
    for a multimodal family; otherwise ``AutoModelForCausalLM`` when its causal-LM auto mapping has the config,
    else ``AutoModelForImageTextToText`` when that one has it (a text model transformers maps only there, as
    Mistral 4's ``Mistral4ForCausalLM``); a ``ValueError`` naming the model type when neither has it."""
    family = FAMILIES.get(getattr(config, "model_type", None))
    if family is not None and family.multimodal:
        return _IMAGE_TEXT
    if _in_auto_mapping(config, "MODEL_FOR_CAUSAL_LM_MAPPING"):
        return _CAUSAL
    if _in_auto_mapping(config, "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING"):
        return _IMAGE_TEXT
    raise ValueError(f"model_type {getattr(config, 'model_type', None)!r} ({type(config).__name__}) is in neither "
                     f"transformers' {_CAUSAL} nor its {_IMAGE_TEXT} mapping: no auto class builds it with its head")


def auto_class(config: Any) -> type:
    import transformers

    return getattr(transformers, auto_class_name(config))


def base_class(model: nn.Module) -> type:
    """The first stock transformers class in ``type(model)``'s MRO."""
    for cls in type(model).__mro__:
        if cls.__module__.startswith("transformers.") and not getattr(cls, "_lightprune_resizing", False):
            return cls
    raise ValueError(f"{type(model).__name__} is not a transformers model class")


def base_class_for_config(config: Any) -> type:
    """The stock class that the auto class of ``config`` maps it to."""
    from transformers.models.auto import modeling_auto

    name = auto_class_name(config)  # the mapping (causal-LM or image-text-to-text) that has the config
    mapping = (modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING if name == _CAUSAL
               else modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING)
    try:
        return mapping[type(config)]
    except KeyError:
        names = (modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if name == _CAUSAL
                 else modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
        model_type = getattr(config, "model_type", None)
        if model_type in names:  # by model type: a config class transformers does not list under that type
            import transformers

            return getattr(transformers, names[model_type])
        raise ValueError(f"no {name} class for model_type {model_type!r}") from None


def moe_block_pattern(model: nn.Module) -> str:
    """Module path of the MoE blocks with the layer index as ``{index}``; one pattern for all layers."""
    patterns = set()
    for layer in find_moe_layers(model):
        parts = layer.name.split(".")
        where = [i for i, part in enumerate(parts) if part == str(layer.index)]
        if not where:
            raise ValueError(f"MoE block {layer.name!r} does not contain its layer index {layer.index}")
        parts[where[-1]] = "{index}"
        patterns.add(".".join(parts))
    if len(patterns) != 1:
        raise ValueError(f"MoE blocks follow more than one path pattern: {sorted(patterns)}")
    return patterns.pop()


def _resize_from_config(model: nn.Module, config: Any) -> None:
    counts = remote_resize.experts_per_layer(config)
    if not counts:
        return
    family = get_family(model)
    moe = {layer.index for layer in family.layers()}
    unknown = sorted(set(counts) - moe)
    if unknown:
        raise ValueError(f"config.{remote_resize.PER_LAYER_KEY} names layers {unknown} that are not MoE "
                         f"layers of {type(model).__name__} (MoE layers: {sorted(moe)})")
    remote_resize.resize_model(model, moe_block_pattern(model), counts, family.router_attr, family.experts_attr,
                               family.router_sub_tensors, family.router_weight_attr, family.block_sub_tensors,
                               family.identity_experts(), family.expert_sub_tensors, family.rows_per_expert())


def resizing_class(base: type) -> type:
    """A subclass of ``base`` (same name) that builds the per-layer expert counts of its config.

    One class per base, cached; ``isinstance(model, base)`` holds for what it builds. It keeps the
    base's name and reports ``is_custom_code() == False``: transformers 5 skips every checkpoint
    conversion mapping of a custom-code class (looked up by class name, then model_type), which
    would leave e.g. InternVL's ``language_model.lm_head.weight`` unmapped on load.
    """
    if getattr(base, "_lightprune_resizing", False):
        return base
    if base not in _RESIZING:
        def __init__(self, config, *args, **kwargs):
            base.__init__(self, config, *args, **kwargs)
            _resize_from_config(self, config)

        def is_custom_code(cls) -> bool:
            return False

        _RESIZING[base] = type(base.__name__, (base,), {
            "__init__": __init__, "is_custom_code": classmethod(is_custom_code), "__module__": __name__,
            "__qualname__": base.__qualname__, "__doc__": base.__doc__, "_lightprune_resizing": True})
    return _RESIZING[base]

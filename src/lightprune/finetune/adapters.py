"""Parameter-efficient adapters as measuring instruments of router sensitivity ("Router Sensitivity Under
Lightweight Fine-Tuning Identifies Prunable Experts in Mixture-of-Experts Models", arXiv 2608.07890, sections 3.3-4).

An adapter is fitted briefly, read, then discarded: the plan is applied to the original weights.

- ``lora`` (peft): ``W + (alpha / r) B A``. Targets: ``router`` (the router weight parameter of every MoE
  layer, through peft's ``target_parameters``: transformers 5 routers are not ``nn.Linear``), ``experts``
  (the fused ``gate_up_proj`` / ``down_proj`` parameters, also ``target_parameters``), ``attention`` (every
  ``nn.Linear`` inside the decoder layers' ``self_attn``), ``all_linear`` (every ``nn.Linear`` except the
  output head, plus router and experts), ``language_model`` (every ``nn.Linear`` inside the language model's
  decoder layers, attention and dense MLP alike; the vision tower and the projector are left out: the recovery of
  MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), appendix D.7; routers and fused
  experts are not ``nn.Linear`` and stay frozen). peft's parameter LoRA (``ParamWrapper``) cannot apply dropout
  to its input, so a LoRA that targets parameters trains with dropout 0 (a warning says so).
- ``ia3``: peft IA3 scales the outputs of the attention projections; the router input and the input of the
  experts' down projection are scaled by `lightprune.finetune.scaling` (peft cannot reach them). The
  router weights stay frozen: the router changes only through its (scaled) input, so sensitivity is read from
  router logits. ``targets`` is ignored (the paper's set: router, attention, experts).
- ``houlsby``: `lightprune.finetune.houlsby`, after every attention and MLP/MoE sublayer.
- ``trainable``: module names (e.g. ``multi_modal_projector``) whose parameters train in full beside any adapter
  (MWOP trains the projector with the LoRA); each name must match a module.
- ``none``: no adapter; the model is returned unchanged and every parameter trains (full fine-tuning).

Every adapter gives the input of each MoE block a gradient where it has none, for DeepSpeed ZeRO-3
(`lightprune.finetune.moe_input_grad`); [`remove_adapters`][] removes the hooks.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

from lightprune.core.checks import check_interval, check_positive_int, real_number
from lightprune.finetune.houlsby import has_houlsby, insert_houlsby, remove_houlsby
from lightprune.finetune.moe_input_grad import moe_inputs_require_grad
from lightprune.finetune.scaling import has_channel_scales, remove_channel_scales, scale_parameter_input
from lightprune.models import find_moe_layers, get_family
from lightprune.models.layer import find_decoder_layers
from lightprune.models.unwrap import base_model_of

__all__ = ["AdapterSpec", "apply_adapter", "remove_adapters", "merged_router_weights", "router_is_trainable"]

ADAPTER_KINDS = ("lora", "ia3", "houlsby", "none")
LORA_TARGETS = ("router", "attention", "experts", "all_linear", "language_model")
_TRAINABLE_ATTR = "_lightprune_trainable_before_adapter"


@dataclass
class AdapterSpec:
    """What adapter to fit. ``targets`` applies to LoRA only; ``reduction`` to Houlsby only; ``trainable``
    names modules that train in full beside the adapter."""

    kind: str = "lora"
    targets: list[str] = field(default_factory=lambda: ["router"])
    r: int = 8
    alpha: float = 8
    dropout: float = 0.1
    reduction: int = 16
    trainable: list[str] = field(default_factory=list)

    def __post_init__(self):
        if self.kind not in ADAPTER_KINDS:
            raise ValueError(f"adapter kind must be one of {list(ADAPTER_KINDS)}, got {self.kind!r}")
        if isinstance(self.targets, str):
            self.targets = [self.targets]
        self.targets = list(self.targets)
        bad = [t for t in self.targets if t not in LORA_TARGETS]
        if bad:
            raise ValueError(f"adapter targets must be among {list(LORA_TARGETS)}, got {bad!r}")
        if self.kind == "lora" and not self.targets:
            raise ValueError(f"a LoRA adapter needs at least one target among {list(LORA_TARGETS)}, got []")
        # numbers as Python numbers (NumPy's too); bools, strings and non-finite values refused
        self.r = check_positive_int("adapter r", self.r)
        alpha = real_number(self.alpha)
        if alpha is None or not 0 < alpha < math.inf:
            raise ValueError(f"adapter alpha must be > 0, got {self.alpha!r}")
        self.alpha = alpha
        self.dropout = check_interval("adapter dropout", self.dropout, 0, 1, "[)")
        self.reduction = check_positive_int("adapter reduction", self.reduction)
        self.trainable = [self.trainable] if isinstance(self.trainable, str) else list(self.trainable)


# a LightningModule records its AdapterSpec in its hyperparameters: let Lightning's weights-only checkpoint
# loading (resuming a fit with ckpt_path) read it back
torch.serialization.add_safe_globals([AdapterSpec])


# ---------------------------------------------------------------------------------------------- helpers
def _names(model: nn.Module) -> dict[int, str]:
    return {id(m): n for n, m in model.named_modules()}


def _router_param_names(model: nn.Module) -> list[str]:
    names = _names(model)
    return [f"{names[id(layer.router_linear)]}.weight" for layer in find_moe_layers(model)]


def _expert_param_names(model: nn.Module) -> list[str]:
    names = _names(model)
    return [f"{names[id(layer.experts)]}.{p}" for layer in find_moe_layers(model)
            for p in ("gate_up_proj", "up_proj", "down_proj") if hasattr(layer.experts, p)]  # ungated: up_proj


def _is_linear(module: nn.Module) -> bool:
    if isinstance(module, nn.Linear):
        return True
    try:  # 4-bit / 8-bit base layers (QLoRA) subclass nn.Linear too, but be explicit
        import bitsandbytes as bnb  # noqa: F401
    except ImportError:
        return False
    return isinstance(module, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt))


def _attention_linear_names(model: nn.Module) -> list[str]:
    prefix, layers = get_family(model).decoder_layers()
    found = []
    for index, layer in enumerate(layers):
        attn = getattr(layer, "self_attn", None)
        if attn is None:
            continue
        found += [f"{prefix}.{index}.self_attn.{n}" for n, m in attn.named_modules() if n and _is_linear(m)]
    if not found:
        raise ValueError(f"{type(model).__name__}: no nn.Linear found in the decoder layers' self_attn")
    return found


def _language_linear_names(model: nn.Module) -> list[str]:
    prefix, layers = find_decoder_layers(model)
    found = [f"{prefix}.{n}" for n, m in layers.named_modules() if n and _is_linear(m)]
    if not found:
        raise ValueError(f"{type(model).__name__}: no nn.Linear found in the language model's decoder layers")
    return found


def _trainable_modules(model: nn.Module, names: list[str]) -> list[nn.Module]:
    """The modules called ``names`` (exact name or last components); a name matching nothing is an error."""
    found = []
    for name in names:
        hits = [m for n, m in model.named_modules() if n == name or n.endswith("." + name)]
        if not hits:
            raise ValueError(f"adapter trainable module {name!r} not found in {type(model).__name__}")
        found += hits
    return found


def _all_linear_names(model: nn.Module) -> list[str]:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    routers = {id(layer_router) for layer_router in _router_modules(model)}
    return [n for n, m in model.named_modules() if _is_linear(m) and m is not head and id(m) not in routers]


def _router_modules(model: nn.Module) -> list[nn.Module]:
    return [layer.router_linear for layer in find_moe_layers(model)]


# ---------------------------------------------------------------------------------------------- apply
def apply_adapter(model: nn.Module, spec: AdapterSpec | dict | None) -> nn.Module:
    """Attach the adapter ``spec`` describes to ``model``; returns the model to train.

    LoRA and IA3 return a peft model wrapping ``model`` (modified in place); Houlsby returns ``model`` with
    adapters inserted. Base weights are frozen and only adapter parameters train (``none``: nothing frozen).
    """
    if spec is None:
        spec = AdapterSpec(kind="none")
    if isinstance(spec, dict):
        spec = AdapterSpec(**spec)
    if spec.kind == "none":
        return model
    full = _trainable_modules(model, spec.trainable)  # checked before the model is touched
    setattr(model, _TRAINABLE_ATTR, {n for n, p in model.named_parameters() if p.requires_grad})
    if spec.kind == "lora":
        adapted = _apply_lora(model, spec)
    elif spec.kind == "ia3":
        adapted = _apply_ia3(model)
    else:
        for p in model.parameters():
            p.requires_grad_(False)
        for adapter in insert_houlsby(model, spec.reduction):
            adapter.requires_grad_(True)
        adapted = model
    for module in full:
        module.requires_grad_(True)
    moe_inputs_require_grad(model)
    return adapted


def _apply_lora(model: nn.Module, spec: AdapterSpec) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    targets = set(spec.targets)
    modules: list[str] = []
    params: list[str] = []
    if "all_linear" in targets:
        modules += _all_linear_names(model)
        targets |= {"router", "experts"}
    elif "attention" in targets:
        modules += _attention_linear_names(model)
    if "language_model" in targets:
        modules += _language_linear_names(model)
    if "router" in targets:
        params += _router_param_names(model)
    if "experts" in targets:
        params += _expert_param_names(model)
    dropout = spec.dropout
    if params and dropout > 0:
        warnings.warn(f"LoRA dropout {dropout} is not applied: peft's parameter LoRA (target_parameters, used for "
                      f"{sorted(targets & {'router', 'experts'})}) cannot apply dropout to its input; training with "
                      "dropout 0", stacklevel=3)
        dropout = 0.0
    config = LoraConfig(r=int(spec.r), lora_alpha=spec.alpha, lora_dropout=dropout,
                        target_modules=sorted(set(modules)), target_parameters=sorted(set(params)) or None)
    peft_model = get_peft_model(model, config)
    _forward_wrapped_attributes(peft_model)
    return peft_model


_FORWARDING: dict[type, type] = {}


def _forward_wrapped_attributes(model: nn.Module) -> None:
    """Let peft's parameter wrappers answer for the module they wrap.

    peft's ``ParamWrapper`` replaces the router / experts module but does not forward attribute reads
    (``experts.gate_up_proj``, DeepSeek's ``router.top_k``), which
    [`lightprune.find_moe_layers`][lightprune.models.find_moe_layers] and the
    family routing code need. Each wrapper's class is swapped for a subclass that falls back to the wrapped
    module; reads give the base (un-adapted) values outside a forward, except ``router.weight``: a LoRA on a
    router's ``weight`` answers with the adapted weight (base + delta, differentiable), so that the family
    routing code (``MoELayer.route``, ``router_logits``) computes the adapted model's router logits.
    """
    from peft.tuners.lora.layer import ParamWrapper

    for module in model.modules():
        cls = type(module)
        if isinstance(module, ParamWrapper) and cls not in _FORWARDING.values():
            if cls not in _FORWARDING:
                _FORWARDING[cls] = type(f"Forwarding{cls.__name__}", (cls,),
                                        {"__getattr__": _fallback_getattr, "weight": property(_adapted_weight)})
            module.__class__ = _FORWARDING[cls]


def _adapted_weight(self) -> torch.Tensor:
    from torch.nn.utils import parametrize

    wrappers, inner = _lora_chain(self)
    if parametrize.is_parametrized(inner, "weight") or not wrappers:
        return inner.weight  # inside the wrapper's own forward the delta is already applied (or nothing to add)
    weight = inner.weight
    for wrapper in wrappers:
        for name in _live_adapters(wrapper):
            weight = weight + wrapper.get_delta_weight(name).to(weight.dtype)
    return weight


def _fallback_getattr(self, name: str):
    try:
        return nn.Module.__getattr__(self, name)
    except AttributeError:
        if name in ("base_layer", "_modules", "_parameters", "_buffers"):
            raise
        return getattr(self._modules["base_layer"], name)


def _apply_ia3(model: nn.Module) -> nn.Module:
    from peft import IA3Config, get_peft_model


    attention = _attention_linear_names(model)
    peft_model = get_peft_model(model, IA3Config(target_modules=attention, feedforward_modules=[]))
    base = peft_model.get_base_model()
    for layer in find_moe_layers(base):
        scale_parameter_input(layer.router_linear, "weight").requires_grad_(True)
        scale_parameter_input(layer.experts, "down_proj", per_expert=True).requires_grad_(True)
    return peft_model


# ---------------------------------------------------------------------------------------------- read
def _lora_chain(router: nn.Module):
    """(LoRA wrappers of the router's ``weight``, the innermost router module)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    wrappers = []
    module = router
    while isinstance(module, BaseTunerLayer):
        if getattr(module, "parameter_name", None) == "weight":
            wrappers.append(module)
        module = module.base_layer
    return wrappers, module


def _base_weight(module: nn.Module) -> torch.Tensor:
    from torch.nn.utils import parametrize

    if parametrize.is_parametrized(module, "weight"):
        return module.parametrizations.weight.original
    return module.weight


def _live_adapters(wrapper) -> list[str]:
    if getattr(wrapper, "disable_adapters", False):
        return []
    merged = set(getattr(wrapper, "merged_adapters", []))
    return [a for a in wrapper.active_adapters if a in wrapper.lora_A and a not in merged]


@torch.no_grad()
def merged_router_weights(model: nn.Module) -> dict[int, torch.Tensor]:
    """{MoE layer index: router weight [E, H] with any LoRA delta added}, computed without changing the model.

    Adapters that do not write to the router (IA3, Houlsby, LoRA without the router target) give the base
    weight. Returned tensors are detached copies in the weight's dtype.
    """
    out: dict[int, torch.Tensor] = {}
    for layer in find_moe_layers(base_model_of(model)):
        wrappers, router = _lora_chain(layer.router_linear)
        weight = _base_weight(router).detach().clone()
        for wrapper in wrappers:
            for name in _live_adapters(wrapper):
                weight += wrapper.get_delta_weight(name).to(weight.dtype)
        out[layer.index] = weight
    return out


def router_is_trainable(model: nn.Module) -> bool:
    """Whether training writes to router weights: a LoRA on the router, or router weights that require grad.

    False for IA3, Houlsby and LoRA without the router target: then a weight delta is identically zero and
    sensitivity must be read from router logits.
    """
    for layer in find_moe_layers(base_model_of(model)):
        wrappers, router = _lora_chain(layer.router_linear)
        if any(_live_adapters(w) for w in wrappers) or _base_weight(router).requires_grad:
            return True
    return False


# ---------------------------------------------------------------------------------------------- remove
def remove_adapters(model: nn.Module) -> nn.Module:
    """The base transformers model with every adapter module and parameter removed, weights NOT merged.

    Works in place: the adapted model must not be used afterwards. Parameters that were trainable before
    [`apply_adapter`][] are made trainable again.
    """
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTuner

    base = base_model_of(model)
    moe_inputs_require_grad(base, enable=False)
    if has_channel_scales(base):
        remove_channel_scales(base)
    if has_houlsby(base):
        remove_houlsby(base)
    if isinstance(model, PeftModel):
        base = model.unload()
    elif isinstance(model, BaseTuner):
        base = model.unload()
    trainable = getattr(base, _TRAINABLE_ATTR, None)
    if trainable is not None:
        for name, param in base.named_parameters():
            param.requires_grad_(name in trainable)
        delattr(base, _TRAINABLE_ATTR)
    return base

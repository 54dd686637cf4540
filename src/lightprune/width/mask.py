"""Reversible MWOP width masks: attention paths per head and FFN channels per modality.

MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), section 3 and appendices A.1 and
D.5:

- attention: a pruned (layer l, head h, path b) has its keys removed BEFORE the softmax, so the query
  normalises over its retained causal keys (`lightprune.width.attention`, registered in
  transformers' ``AttentionInterface``; only the language model's configs are switched, the vision tower
  keeps its implementation). SYSTEM tokens are always attendable and never pruned.
- FFN: a pruned channel c for modality mu is skipped for tokens of modality mu, i.e. the input of
  ``mlp.down_proj``, ``h = act(gate_proj x) * up_proj x`` [B, T, m], is multiplied per token by
  ``ffn_keep[l]["vision"]`` (VISION tokens) or ``ffn_keep[l]["text"]`` (TEXT tokens); SYSTEM and PAD
  tokens run the full FFN. The hook sits on the module the MLP calls, so a peft LoRA on ``down_proj``
  sees the masked input too (apply adapters before masking).

Token modalities ([`lightprune.width.modality.token_modality`][..token_modality]) are read from ``input_ids`` and
``attention_mask`` by a forward pre-hook on the transformers model; during generation with a cache the new tokens
are appended as TEXT. Masks are constants in the graph (gradients flow for recovery training), ``remove()`` restores
the model bitwise, and nesting is refused. `WidthHooks` also carries the Taylor gates of `lightprune.width.taylor`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from lightprune.observe.attention_interface import language_model_configs, restore_attention, switch_attention
from lightprune.width import attention as path_attention
from lightprune.width.gates import channel_gate
from lightprune.width.kernels import BACKENDS
from lightprune.width.layers import find_width_layers, language_decoder, vision_token_ids
from lightprune.width.modality import token_modality
from lightprune.width.paths import MODALITIES, PAD, PATHS, TEXT, VISION
from lightprune.width.plan import WidthPlan

__all__ = ["mask_width", "WidthHooks"]

_ACTIVE: dict[int, "WidthHooks"] = {}  # id(transformers model) -> the hooks active on it


def _past_length(kwargs: dict) -> int:
    position = kwargs.get("cache_position")
    if isinstance(position, torch.Tensor) and position.numel():
        return int(position.reshape(-1)[0])
    for name in ("cache", "past_key_values"):
        cache = kwargs.get(name)
        if cache is not None and hasattr(cache, "get_seq_length"):
            return int(cache.get_seq_length())
    return 0


def _layer_backends(attention_backend, plan: WidthPlan | None) -> dict[int, str | dict[str, str]]:
    """``{layer: backend}`` (a name, or ``{device type: name}``) from WidthHooks' ``attention_backend``: None, one
    name for every layer, or a mapping that names every layer whose plan prunes a path."""
    if attention_backend is None:
        return {}
    layers = sorted(plan.attn_keep) if plan is not None else []
    if isinstance(attention_backend, str):
        if attention_backend not in BACKENDS:
            raise ValueError(f"attention_backend must be None or one of {list(BACKENDS)}, got {attention_backend!r}")
        return dict.fromkeys(layers, attention_backend)
    if not isinstance(attention_backend, Mapping):
        raise TypeError(f"attention_backend must be a backend name, a mapping layer -> backend (or -> {{device type: "
                        f"backend}}) or None, got {type(attention_backend).__name__}")
    out: dict[int, str | dict[str, str]] = {}
    for layer, value in attention_backend.items():
        names = value.values() if isinstance(value, Mapping) else [value]
        bad = [name for name in names if name not in BACKENDS]
        if bad:
            raise ValueError(f"attention_backend for layer {layer}: {bad[0]!r} is not one of {list(BACKENDS)}")
        out[int(layer)] = dict(value) if isinstance(value, Mapping) else value
    missing = [i for i in layers if i not in out and not bool(plan.attn_keep[i].all())]
    if missing:
        raise ValueError(f"attention_backend names no backend for layers {missing}, whose plan prunes paths")
    return out


class WidthHooks:
    """Everything width masking installs on a model (see module docstring); removable, refuses nesting.

    ``plan`` masks what it prunes; ``gate_attention`` / ``gate_ffn`` route every layer (every dense FFN)
    through gates that `new_gates` creates per batch (Taylor importance).
    """

    def __init__(self, model: nn.Module, plan: WidthPlan | None, *, gate_attention: bool = False,
                 gate_ffn: bool = False, attention_backend: str | Mapping | None = None):
        if plan is not None and not isinstance(plan, WidthPlan):
            raise TypeError(f"plan must be a WidthPlan, got {type(plan).__name__}")
        if plan is not None:
            plan.validate(model)
        backends = _layer_backends(attention_backend, plan)
        base, path, decoder = language_decoder(model)
        self.base = base
        self.layers = {layer.index: layer for layer in find_width_layers(model)}
        self.vision_ids = vision_token_ids(model)
        if id(base) in _ACTIVE:
            raise RuntimeError(f"width masks are already active on this {type(base).__name__}: nested mask_width / "
                               f"taylor_importance is not supported; remove the active one first")
        self.state = path_attention.ModalityState()
        attn_layers = set(plan.attn_keep) if plan is not None else set()
        if gate_attention:
            attn_layers = set(self.layers)
        ffn_layers = set(plan.ffn_keep) if plan is not None else set()
        if gate_ffn:
            ffn_layers = {i for i, layer in self.layers.items() if layer.down_proj is not None}
        self.routes: dict[int, path_attention.PathRoute] = {}
        self.ffn_keep: dict[int, dict[str, torch.Tensor]] = {}
        self.ffn_gate: dict[int, torch.Tensor | None] = {i: None for i in ffn_layers}
        self._gate_attention, self._gate_ffn = gate_attention, gate_ffn
        self._handles: list = []
        self._saved: list = []
        self.active = False
        _ACTIVE[id(base)] = self
        try:
            if attn_layers:
                parent = base.get_submodule(path.rsplit(".", 1)[0]) if "." in path else base
                self._saved = switch_attention(language_model_configs(decoder, parent), path_attention.register)
            for i in sorted(attn_layers):
                keep = plan.attn_keep.get(i) if plan is not None else None
                if keep is not None:
                    keep = keep.to(self._device(self.layers[i].attention))
                self.routes[i] = path_attention.PathRoute(layer=i, state=self.state, keep=keep,
                                                          backend=backends.get(i))
                path_attention.route(self.layers[i].attention, self.routes[i])
            for i in sorted(ffn_layers):
                if plan is not None and i in plan.ffn_keep:
                    device = self._device(self.layers[i].mlp)
                    self.ffn_keep[i] = {mu: plan.ffn_keep[i][mu].to(device) for mu in MODALITIES}
                self._handles.append(self.layers[i].down_proj.register_forward_pre_hook(self._ffn_hook(i)))
            self._handles.append(base.register_forward_pre_hook(self._modality_hook, with_kwargs=True))
        except BaseException:
            self.remove()
            raise
        self.active = True

    @staticmethod
    def _device(module: nn.Module) -> torch.device:
        param = next(module.parameters(), None)
        return param.device if param is not None else torch.device("cpu")

    # ------------------------------------------------------------------ gates (Taylor)
    def new_gates(self, batch: int, device: torch.device) -> dict[tuple[str, int], torch.Tensor]:
        """Fresh all-one gates requiring grad: ("attn", l) [B, H, 3] and ("ffn", l) [B, m, 2]."""
        gates = {}
        if self._gate_attention:
            for i, r in self.routes.items():
                r.gate = torch.ones(batch, self.layers[i].num_heads, len(PATHS), device=device, requires_grad=True)
                gates[("attn", i)] = r.gate
        if self._gate_ffn:
            for i in self.ffn_gate:
                self.ffn_gate[i] = torch.ones(batch, self.layers[i].intermediate_size, len(MODALITIES),
                                              device=device, requires_grad=True)
                gates[("ffn", i)] = self.ffn_gate[i]
        return gates

    def clear_gates(self) -> None:
        for r in self.routes.values():
            r.gate = None
        self.ffn_gate = {i: None for i in self.ffn_gate}

    # ------------------------------------------------------------------ hooks
    def _modality_hook(self, module: nn.Module, args: tuple, kwargs: dict):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if input_ids is None:
            if kwargs.get("inputs_embeds") is not None:
                raise ValueError("width masks need input_ids to tell vision from text tokens; the model was called "
                                 "with inputs_embeds only")
            raise ValueError("width masks need input_ids: the model was called without them")
        if len(args) > 1:
            raise ValueError("width masks read attention_mask by keyword: pass model(input_ids, attention_mask=...)")
        mask = kwargs.get("attention_mask")
        if isinstance(mask, dict):
            raise ValueError("width masks need the 2D attention_mask, the model was given prepared 4D masks")
        past = _past_length(kwargs)
        if past == 0:
            self.state.modality = token_modality(input_ids, mask, self.vision_ids)
            return None
        previous = self.state.modality
        if previous is None or previous.shape != (input_ids.shape[0], past):
            raise RuntimeError(f"width masks: a cached forward after {past} tokens, but the recorded tokens are "
                               f"{None if previous is None else tuple(previous.shape)}; run the prefill under the "
                               f"same masks")
        new = torch.full(input_ids.shape, TEXT, dtype=torch.int8, device=previous.device)
        if mask is not None:
            new[mask[:, -input_ids.shape[1]:].to(new.device) == 0] = PAD
        self.state.modality = torch.cat([previous, new], dim=1)
        return None

    def _ffn_hook(self, index: int):
        def hook(module: nn.Module, args: tuple):
            h = args[0]
            mod = recorded_modality(self.state, h, f"width masks, layer {index} FFN", "down_proj input").to(h.device)
            keep, gate = self.ffn_keep.get(index), self.ffn_gate.get(index)
            if keep is None and gate is None:
                return None
            if keep is not None:
                one = torch.ones((), dtype=h.dtype, device=h.device)
                is_vision, is_text = (mod == VISION)[..., None], (mod == TEXT)[..., None]
                h = h * torch.where(is_vision, keep["vision"].to(h.dtype),
                                    torch.where(is_text, keep["text"].to(h.dtype), one))
            if gate is not None:
                h = channel_gate(h, gate, mod)
            return (h, *args[1:])

        return hook

    # ------------------------------------------------------------------ removal
    def remove(self) -> None:
        """Remove every hook, route and registration (idempotent); the model computes as before."""
        while self._handles:
            self._handles.pop().remove()
        for i, r in self.routes.items():
            path_attention.unroute(self.layers[i].attention, r)
        self.routes = {}
        restore_attention(self._saved)
        self.state.modality = None
        if _ACTIVE.get(id(self.base)) is self:
            del _ACTIVE[id(self.base)]
        self.active = False


def recorded_modality(state: path_attention.ModalityState, hidden: torch.Tensor, where: str, what: str) -> torch.Tensor:
    """The token modality the hooks recorded (``state.modality`` [B, T]), its last positions those of ``hidden``
    [B, T', ...] (``what``: how messages name it); a RuntimeError naming ``where`` when none was recorded or the
    shapes do not match."""
    mod = state.modality
    if mod is None:
        raise RuntimeError(f"{where}: no token modality recorded (call the model with input_ids)")
    if hidden.dim() != 3 or hidden.shape[0] != mod.shape[0] or hidden.shape[1] > mod.shape[1]:
        raise RuntimeError(f"{where}: {what} {tuple(hidden.shape)} does not match the tokens {tuple(mod.shape)}")
    return mod[:, mod.shape[1] - hidden.shape[1]:]


class RemovableHandle:
    """What a width change installed on a model (``active``, ``remove()``), usable as a ``with`` block too: leaving
    it removes the change; entering one already removed is refused (``removed``: how its message names it)."""

    removed = "this handle was removed"

    def __enter__(self):
        if not self.active:
            raise RuntimeError(f"{self.removed}; create a new one")
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


class mask_width(RemovableHandle):  # noqa: N801 - a context manager used like a function, as mask_experts
    """Apply ``plan``'s width masks to ``model`` now; ``remove()`` (or leaving the ``with`` block) undoes them.

    ``plan.validate(model)`` runs first. Usable as ``with mask_width(model, plan): ...`` and as a handle
    ``h = mask_width(model, plan); ...; h.remove()``.
    """

    removed = "this mask_width handle was removed"

    def __init__(self, model: nn.Module, plan: WidthPlan):
        if not isinstance(plan, WidthPlan):
            raise TypeError(f"mask_width needs a WidthPlan, got {type(plan).__name__}")
        self.model = model
        self.plan = plan
        self._hooks = WidthHooks(model, plan)

    @property
    def active(self) -> bool:
        return self._hooks.active

    def remove(self) -> None:
        self._hooks.remove()

"""The observing experts implementation: each routed expert runs on its routed tokens only, and
the unweighted outputs are handed to an observer before the weighted sum is returned.

transformers 5 dispatches a fused experts module's forward through ``ExpertsInterface`` by
``config._experts_implementation``. `observing_experts` registers ``"lightprune_observe"``
there once and, for the duration of a ``with`` block, points the MoE layers' configs at it; the
previous implementation names are restored on exit (also on error); a family whose experts do not dispatch there
observes them through its own MoE block's forward instead
([`observed_block`][lightprune.models.base.MoEFamily.observed_block],
Llama 4), installed on the block for the duration. The observer receives
``(layer, hidden_states [T, H], router_input [T, H'], top_k_index [T, k], top_k_weights [T, k], outputs [T, k, H],
extra_outputs [n, H] or None)`` where ``outputs[t, s]`` is expert ``top_k_index[t, s]``'s unweighted output f(h_t),
``router_input`` what the layer's router was called with for the same tokens (a forward pre-hook on the router,
removed on exit): the experts' input in most families, the decoder layer's residual stream in Gemma 4, whose experts
get a normed copy; ``extra_outputs`` the rows an ``extra`` callback asked for, run in the same grouped matmuls.
With ``router_logits=True`` the observer and ``extra`` also get ``router_logits=``: the logits the router returned
(a forward hook), where the family's router returns them (``MoEFamily.router_returns_logits``), else None; and
``routing_state=``: what the family's [`observed_router`][lightprune.models.base.MoEFamily.observed_router] (the
router's forward in the block, where the family has one) kept in the same call, else None.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from lightprune.models import MoELayer
from lightprune.models.experts_kernel import grouped_mm_runs
from lightprune.models.selection import selection_outputs, weighted_sum

__all__ = ["IMPLEMENTATION", "observing_experts", "expert_outputs", "expert_rows", "run_expert"]

IMPLEMENTATION = "lightprune_observe"
Observer = Callable[..., None]
#: (layer, hidden_states, router_input, top_k_index) -> (tokens, experts) of further rows to run, or None
ExtraRows = Callable[[MoELayer, torch.Tensor, torch.Tensor, torch.Tensor], "tuple[torch.Tensor, torch.Tensor] | None"]

_OBSERVERS: dict[int, tuple[MoELayer, Observer, ExtraRows | None, bool]] = {}
#: the last input of each observed layer's router, by id of the layer's experts module
_ROUTER_INPUTS: dict[int, torch.Tensor] = {}
#: the logits the router returned with that input, and what the family's observed router kept (observers that
#: asked for them)
_ROUTER_LOGITS: dict[int, torch.Tensor] = {}
_ROUTER_STATES: dict[int, object] = {}


def run_expert(experts: nn.Module, index: int, x: torch.Tensor) -> torch.Tensor:
    """Expert ``index`` of a fused experts module on tokens ``x`` [n, H] -> [n, H] (unweighted)."""
    transposed = getattr(experts, "is_transposed", False)

    def linear(inp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = inp @ weight[index] if transposed else F.linear(inp, weight[index])
        return out + bias[index] if bias is not None else out

    return _expert_mlp(experts, x, linear)


def _expert_mlp(experts: nn.Module, x: torch.Tensor, linear: Callable) -> torch.Tensor:
    """A fused experts module's MLP on ``x`` with its projections applied by ``linear(input, weight, bias or
    None)``: gate_up, the module's gate (or the activation of up_proj when it has no gate), down, and the module's
    ``post_expert_norm`` of each output row where it has one (``has_post_expert_norm``: Muse Spark)."""
    has_bias = getattr(experts, "has_bias", False)

    def bias(name: str) -> torch.Tensor | None:
        return getattr(experts, name, None) if has_bias else None

    if getattr(experts, "has_gate", True):
        hidden = linear(x, experts.gate_up_proj, bias("gate_up_proj_bias"))
        hidden = experts._apply_gate(hidden) if hasattr(experts, "_apply_gate") else _gate(experts, hidden)
    else:
        hidden = experts.act_fn(linear(x, experts.up_proj, bias("up_proj_bias")))
    out = linear(hidden, experts.down_proj, bias("down_proj_bias"))
    return experts.post_expert_norm(out) if getattr(experts, "has_post_expert_norm", False) else out


def _gate(experts: nn.Module, gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return experts.act_fn(gate) * up


def expert_rows(experts: nn.Module, hidden_states: torch.Tensor, tokens: torch.Tensor,
                expert_ids: torch.Tensor) -> torch.Tensor:
    """Unweighted outputs ``[n, H]``: row i is expert ``expert_ids[i]`` on token ``hidden_states[tokens[i]]``.

    The rows are sorted by expert and each projection of every expert runs in one grouped matmul (transformers'
    own, as its ``grouped_mm`` experts do), else one call per expert: where transformers has none, or torch's kernel
    cannot run the experts (`grouped_mm_runs`: float64, rows not a multiple
    of 16 bytes)."""
    num = expert_ids.numel()
    out = torch.empty(num, hidden_states.shape[-1], dtype=hidden_states.dtype, device=hidden_states.device)
    if num == 0:
        return out
    ids, order = torch.sort(expert_ids, stable=True)
    # rows per expert, counted on the device (``bincount`` reads its input's maximum back to the host)
    counts = torch.zeros(experts.num_experts, dtype=torch.long, device=ids.device).index_add_(0, ids,
                                                                                             torch.ones_like(ids))
    x = hidden_states.index_select(0, tokens.index_select(0, order))  # index_select: a CPU gathers rows faster
    if _GROUPED_MM is not None and grouped_mm_runs(experts):
        out[order] = _grouped_rows(experts, x, ids, torch.cumsum(counts, dim=0, dtype=torch.int32)).to(out.dtype)
        return out
    start = 0
    for expert, count in enumerate(counts.tolist()):
        if count:
            rows = order[start:start + count]
            out[rows] = run_expert(experts, expert, x[start:start + count]).to(out.dtype)
            start += count
    return out


def _transformers_grouped_mm() -> Callable | None:
    """transformers' grouped-matmul dispatcher (it picks torch's kernel where the device, dtype and alignment allow
    it, else its own fallback op), or None where this transformers has none."""
    try:
        from transformers.integrations.moe import _grouped_mm
    except ImportError:
        return None
    return _grouped_mm


#: the grouped matmul of transformers' ``grouped_mm`` experts, or None (one call per expert instead)
_GROUPED_MM = _transformers_grouped_mm()


def _grouped_rows(experts: nn.Module, x: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """`run_expert` for rows sorted by expert (``ids``, group ends ``offsets``), one grouped matmul per
    projection."""
    transposed = getattr(experts, "is_transposed", False)

    def linear(inp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = _GROUPED_MM(inp, weight if transposed else weight.transpose(-2, -1), offsets)
        return out + bias[ids] if bias is not None else out

    return _expert_mlp(experts, x, linear)


def expert_outputs(experts: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                   extra: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Unweighted outputs ``[T, k, H]`` of the selected experts, each run only on its routed tokens, and those of
    the ``extra`` (tokens, experts) rows [n, H] (None without), run in the same grouped matmuls."""
    return selection_outputs(top_k_index, extra, lambda tokens, ids: expert_rows(experts, hidden_states, tokens, ids))


def _observe(experts: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
             top_k_weights: torch.Tensor, run: Callable) -> torch.Tensor:
    """The selected experts' outputs [T, k, H] from ``run(rows)`` (rows: the observer's extra (tokens, experts) or
    None -> (outputs, extra outputs or None)), handed to the layer's observer with what its router saw."""
    entry = _OBSERVERS.get(id(experts))
    if entry is None:
        return run(None)[0]
    layer, observer, extra, with_logits = entry
    router_input = _ROUTER_INPUTS.pop(id(experts), None)
    logits = {"router_logits": _ROUTER_LOGITS.pop(id(experts), None),
              "routing_state": _ROUTER_STATES.pop(id(experts), None)} if with_logits else {}
    if router_input is not None:  # [T, H]; the experts may read a narrower projection (Nemotron-H's latent)
        router_input = router_input.reshape(-1, router_input.shape[-1])
    if router_input is None or router_input.shape[0] != hidden_states.shape[0]:
        raise RuntimeError(f"layer {layer.index}: its experts ran without a router call on the same tokens "
                           "before them; lightprune observes experts routed by the layer's own router")
    rows = extra(layer, hidden_states, router_input, top_k_index, **logits) if extra is not None else None
    outputs, extra_outputs = run(rows)
    observer(layer, hidden_states, router_input, top_k_index, top_k_weights, outputs, extra_outputs, **logits)
    return outputs


def _observing_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                       top_k_weights: torch.Tensor) -> torch.Tensor:
    outputs = _observe(self, hidden_states, top_k_index, top_k_weights,
                       lambda rows: expert_outputs(self, hidden_states, top_k_index, rows))
    return weighted_sum(outputs, top_k_weights, hidden_states.dtype)


def _register() -> None:
    from transformers.integrations.moe import ExpertsInterface

    if IMPLEMENTATION not in ExpertsInterface._global_mapping:
        ExpertsInterface.register(IMPLEMENTATION, _observing_forward)


def _router_input_hook(key: int):
    """A forward pre-hook that keeps the router's hidden-states input (first positional, or ``hidden_states``)."""
    def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        hidden = args[0] if args else kwargs.get("hidden_states")
        if isinstance(hidden, torch.Tensor):
            _ROUTER_INPUTS[key] = hidden.detach()
    return hook


def _router_logits_hook(key: int):
    """A forward hook that keeps the logits a router returned (the first of its outputs)."""
    def hook(module: nn.Module, args: tuple, output) -> None:
        logits = output[0] if isinstance(output, (tuple, list)) else output
        if isinstance(logits, torch.Tensor):
            _ROUTER_LOGITS[key] = logits.detach()
    return hook


def _keeper(key: int) -> Callable[[object], None]:
    """What a family's observed router calls with the state it keeps for the layer's next experts call."""
    def keep(state: object) -> None:
        _ROUTER_STATES[key] = state
    return keep


@contextmanager
def observing_experts(layers: list[MoELayer], observer: Observer, extra: ExtraRows | None = None,
                      router_logits: bool = False) -> Iterator[None]:
    """Route every listed layer's experts through the observing implementation inside the block.

    ``extra`` (optional) is asked before a layer's experts run for further (token, expert) rows; their unweighted
    outputs [n, H] are computed with the routed ones and handed to the observer (None without ``extra`` or when it
    returns None). ``router_logits``: also hand both the logits the router returned (keyword ``router_logits``; None
    where the family's router does not return its logits) and the routing state its observed router kept (keyword
    ``routing_state``), the router's forward replaced by the family's observed one in the block where it has one."""
    _register()
    configs: dict[int, tuple[object, object]] = {}
    handles = []
    replaced: list[nn.Module] = []
    try:
        for layer in layers:
            if id(layer.experts) in _OBSERVERS:
                raise RuntimeError(f"layer {layer.index} is already observed: nested observation is not supported")
            block_forward = layer.family.observed_block(layer, partial(_observe, layer.experts), expert_rows)
            config = getattr(layer.experts, "config", None)
            if block_forward is not None:  # experts outside ExpertsInterface: observed by the family's own block
                layer.block.forward = block_forward
                replaced.append(layer.block)
            elif config is None or not hasattr(config, "_experts_implementation_internal"):
                raise ValueError(f"layer {layer.index}: {type(layer.experts).__name__} does not dispatch through "
                                 "transformers' ExpertsInterface and its family observes no block of its own; "
                                 "cannot observe it")
            else:
                configs.setdefault(id(config), (config, config._experts_implementation_internal))
            _OBSERVERS[id(layer.experts)] = (layer, observer, extra, router_logits)
            handles.append(layer.router.register_forward_pre_hook(_router_input_hook(id(layer.experts)),
                                                                  with_kwargs=True))
            if router_logits and layer.family.router_returns_logits:
                handles.append(layer.router.register_forward_hook(_router_logits_hook(id(layer.experts))))
                forward = layer.family.observed_router(layer, _keeper(id(layer.experts)))
                if forward is not None:
                    layer.router.forward = forward
                    replaced.append(layer.router)
        for config, _ in configs.values():
            config._experts_implementation_internal = IMPLEMENTATION
        yield
    finally:
        for handle in handles:
            handle.remove()
        for module in replaced:
            del module.forward
        for config, previous in configs.values():
            config._experts_implementation_internal = previous
        for layer in layers:
            entry = _OBSERVERS.get(id(layer.experts))
            if entry is not None and entry[1] is observer:
                del _OBSERVERS[id(layer.experts)]
                _ROUTER_INPUTS.pop(id(layer.experts), None)
                _ROUTER_LOGITS.pop(id(layer.experts), None)
                _ROUTER_STATES.pop(id(layer.experts), None)

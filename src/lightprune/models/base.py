"""Model families: the only code that knows where a family keeps its routers and experts.

A family is chosen by ``config.model_type``. It finds the MoE layers (skipping dense ones by
the family's own rule), runs the family's routing rule with an optional expert mask, and names
the config keys that count experts. Everything else in lightprune talks to the layers it builds
([`MoELayer`][..layer.MoELayer]).

transformers 5 stores a layer's experts as fused 3D parameters: ``gate_up_proj [E, 2I, H]`` and
``down_proj [E, H, I]``; the router is a module with a ``weight [E, H]`` row per expert.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from lightprune.models.family_tensors import FamilyTensors
from lightprune.models.layer import (
    MoELayer,
    RoutingOutput,
    config_value,
    find_decoder_layers,
    kept_entries,
    kept_experts,
    mlp_layer_type,
)
from lightprune.models.removal import RemovalEffect

__all__ = ["MoEFamily", "SelectsWithExpertTensor", "SelectsKept", "RemovalEffect"]


class MoEFamily(FamilyTensors):
    """Base family. Subclasses set the class attributes and implement [`route`][]."""

    model_types: ClassVar[tuple[str, ...]] = ()
    #: config attribute holding the routed-expert count (on the text config for MLLMs; dotted: a sub-config's)
    num_experts_key: ClassVar[str] = "num_experts"
    #: module attribute names inside a decoder layer / MoE block; ``mlp_attr = ""``: the decoder layer itself holds
    #: the router and the experts (Gemma 4, beside its dense MLP)
    mlp_attr: ClassVar[str] = "mlp"
    router_attr: ClassVar[str] = "gate"
    #: submodule of the router holding ``weight [E, H]`` ("": the router itself)
    router_weight_attr: ClassVar[str] = ""
    experts_attr: ClassVar[str] = "experts"
    #: MoE block attributes holding always-on experts
    shared_attrs: ClassVar[tuple[str, ...]] = ()
    #: True for MLLMs: the MoE language model sits inside a conditional-generation model
    multimodal: ClassVar[bool] = False
    #: top-level config keys of the image / video placeholder token ids (audio placeholders are not vision)
    vision_token_keys: ClassVar[tuple[str, ...]] = ()
    #: the one language-model type an MLLM family is exact for (its ``text_config.model_type``; None: any)
    language_model_type: ClassVar[str | None] = None
    #: True when removing an expert a token did not select leaves its routing exactly as it was (a top-k whose
    #: weights depend only on the selected experts: renormalised, top-k-then-softmax, per-expert sigmoid)
    unselected_removal_is_free: ClassVar[bool] = False
    #: True for group-limited routers (top-2 group scores need two experts in every group)
    group_limited: ClassVar[bool] = False
    #: the routing rule in a few words (the family table of docs/extending/family.md)
    routing: ClassVar[str] = "softmax over the experts, top-k"
    #: per-expert tensors in submodules of the router: (submodule, name, the experts' dimension); submodule ""
    #: is the router itself
    router_sub_tensors: ClassVar[tuple[tuple[str, str, int], ...]] = ()
    #: True when the router module's forward returns ``(logits, ...)`` with the logits exactly :meth:`router_logits` of
    #: its input (every transformers 5 router here but Gemma 4's, which returns probabilities): calibration then
    #: reads them instead of recomputing them
    router_returns_logits: ClassVar[bool] = True
    #: config key of the count of zero-computation (identity) experts, whose router rows follow the routed experts'
    #: (LongCat-Flash's ``zero_expert_num``); None: the family has none
    identity_experts_key: ClassVar[str | None] = None
    #: the experts' per-expert tensors where they are not :data:`EXPERT_TENSORS` of the experts module, as
    #: (submodule of the experts module, name): each stores every expert's ``rows`` rows one after another along
    #: dimension 0 (DBRX: ``mlp.w1`` [E * I, H]); :attr:`expert_rows_key` names the config field of ``rows``
    expert_sub_tensors: ClassVar[tuple[tuple[str, str], ...]] = ()
    expert_rows_key: ClassVar[str | None] = None
    #: per-expert tensors the MoE block keeps outside its router, as (submodule, name, dim) with "" the block itself
    #: and a dotted path a nested module (MiniMax-M2's ``e_score_correction_bias``, AFMoE's ``expert_bias``, Ergo's
    #: ``experts.post_expert_norm.weight``); a missing one is skipped
    block_sub_tensors: ClassVar[tuple[tuple[str, str, int], ...]] = ()

    #: lightprune's config key for per-layer expert counts of a non-uniform prune
    PER_LAYER_KEY: ClassVar[str] = "lightprune_experts_per_layer"

    def __init__(self, model: nn.Module):
        self.model = model
        wanted, found = self.language_model_type, getattr(self.text_config, "model_type", None)
        if wanted is not None and found != wanted:
            raise ValueError(f"{type(self).__name__} ({', '.join(self.model_types)}) is supported with a {wanted} "
                             f"language model, got {found!r}")

    # ----------------------------------------------------------------- config and paths
    @property
    def config(self):
        return self.model.config

    @property
    def text_config(self):
        """The config of the MoE language model (the config itself for text-only families)."""
        if self.multimodal:
            return self.config.text_config
        return self.config

    def decoder_layers(self) -> tuple[str, nn.ModuleList]:
        """(module path, ModuleList) of the language model's decoder layers."""
        return find_decoder_layers(self.model)

    def is_sparse_layer(self, index: int) -> bool:
        """The family's rule for whether decoder layer ``index`` has an MoE block."""
        cfg = self.text_config
        listed = mlp_layer_type(cfg, index)
        if listed is not None:
            return listed
        # transformers builds a dense MLP everywhere when the expert count is 0 (Qwen families)
        count = config_value(cfg, self.num_experts_key)
        if count is not None and int(count) <= 0:
            return False
        if index in (getattr(cfg, "mlp_only_layers", None) or []):
            return False
        step = getattr(cfg, "decoder_sparse_step", 1) or 1
        return (index + 1) % step == 0

    def top_k(self) -> int:
        return int(self.text_config.num_experts_per_tok)

    def layer_top_k(self, index: int) -> int:
        """Experts per token in decoder layer ``index`` (`top_k` unless the config lists one per layer)."""
        return self.top_k()

    def group_limits(self) -> tuple[int, int]:
        return 1, 1

    def expert_output_width(self, layer: MoELayer) -> int:
        """The width of an expert's output: ``down_proj`` [E, H, I] (or [E, I, H] when the module is transposed)."""
        down = layer.experts.down_proj
        return int(down.shape[2] if getattr(layer.experts, "is_transposed", False) else down.shape[1])

    def identity_experts(self) -> int:
        """Zero-computation (identity) experts per MoE layer (`identity_experts_key`; 0 without)."""
        key = self.identity_experts_key
        return int(getattr(self.text_config, key, 0) or 0) if key else 0

    def output_scale(self, layer: MoELayer) -> float:
        """The factor the MoE block multiplies the routed experts' weighted sum by after the experts module (1.0;
        Laguna's ``moe_routed_scaling_factor``): calibration weighs each expert output by ``w * output_scale``."""
        return 1.0

    def vision_token_ids(self) -> tuple[int, ...]:
        """Token ids of the image/video placeholders that the vision features replace (empty for text-only): the
        set values of `vision_token_keys` on the top-level config, in order, without repeats.

        A vision token of a batch is a position whose ``input_ids`` value is one of these ids; start/end
        markers around an image (Qwen3-VL ``vision_start``/``vision_end``) are not vision tokens.
        """
        found: list[int] = []
        for key in self.vision_token_keys:
            value = getattr(self.config, key, None)
            if value is not None and int(value) not in found:
                found.append(int(value))
        return tuple(found)

    # ----------------------------------------------------------------- layers
    def layers(self) -> list[MoELayer]:
        prefix, decoder = self.decoder_layers()
        found: list[MoELayer] = []
        for index, layer in enumerate(decoder):
            block = getattr(layer, self.mlp_attr) if self.mlp_attr else layer
            router = getattr(block, self.router_attr, None)
            experts = getattr(block, self.experts_attr, None)
            sparse = self.is_sparse_layer(index)
            has_moe = router is not None and experts is not None and bool(self._expert_tensors_of(experts))
            if sparse != has_moe:
                raise ValueError(
                    f"{type(self.model).__name__} layer {index}: the config says "
                    f"{'sparse' if sparse else 'dense'} but the module is {type(block).__name__}")
            if not sparse:
                continue
            n_group, topk_group = self.group_limits()
            linear = getattr(router, self.router_weight_attr) if self.router_weight_attr else router
            identity = self.identity_experts()
            found.append(MoELayer(
                index=index, name=f"{prefix}.{index}" + (f".{self.mlp_attr}" if self.mlp_attr else ""), block=block,
                router=router, experts=experts, num_experts=int(_stored_shape(linear)[0]) - identity,
                top_k=self.layer_top_k(index),
                has_shared_experts=any(getattr(block, a, None) is not None for a in self.shared_attrs),
                n_group=n_group, topk_group=topk_group, family=self, grouped=self.group_limited,
                identity_experts=identity))
        return found

    # ----------------------------------------------------------------- routing
    #: how the router turns logits into scores: "softmax" or "sigmoid" (DeepSeek-V3)
    score_function: ClassVar[str] = "softmax"

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        """The router's logits [T, E] for ``hidden_states``, as the family computes them. The default is a plain
        linear router, op for op as transformers' routers compute it: ``F.linear(h, router.weight)``."""
        return F.linear(hidden_states.reshape(-1, layer.router.weight.shape[1]), layer.router.weight)

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        """The family's selection from ``router_logits`` with ``expert_mask`` experts removed.

        ``expert_mask`` is [E] bool (True = masked out) or broadcastable to the logits, one mask
        per token row; masked logits (and selection scores) are -inf before selection.
        """
        raise NotImplementedError

    def select_without(self, layer: MoELayer, router_logits: torch.Tensor, tokens: torch.Tensor,
                       experts: torch.Tensor) -> RoutingOutput:
        """[`select`][] of token ``tokens[i]`` (rows of ``router_logits`` [T, E]) with expert ``experts[i]`` removed,
        one (token, expert) pair per row: what calibration re-runs for a [`RemovalEffect`][]'s ``rerun`` pairs.
        The default masks one expert per row and calls [`select`][] on [n, E]; a family may compute it from
        fewer candidates (the order of the selected experts may differ from [`select`][]'s)."""
        mask = torch.zeros(tokens.numel(), router_logits.shape[-1], dtype=torch.bool, device=router_logits.device)
        mask[torch.arange(tokens.numel(), device=router_logits.device), experts] = True
        return self.select(layer, router_logits[tokens], mask)

    def observed_router(self, layer: MoELayer, keep: Callable[[Any], None]) -> Callable[..., Any] | None:
        """A forward for ``layer.router`` while calibration observes the layer, or None (the router's own, the
        default). It returns exactly what the router's forward returns (bit for bit) and passes ``keep`` what it
        computed on the way that [`removal_effect`][] can reuse for the same logits (its ``routing_state``)."""
        return None

    def router_output(self, layer: MoELayer, routed: RoutingOutput) -> Any:
        """What ``layer.router``'s forward returns for the routing ``routed`` ([`route`][]'s output): ``routed``
        itself (every transformers 5 router here but Llama 4's, which returns dense scores and the logits). A masked
        router returns this, so that the MoE block reads it as it reads its own router's."""
        return routed

    #: True when the experts module is not called with the routed tokens but the block feeds them the router's input
    #: itself (Llama 4: scaled per expert, every expert on every token): what the router gets is the experts' input
    experts_read_router_input: ClassVar[bool] = False

    def routed_output(self, layer: MoELayer, router_input: torch.Tensor, expert_input: torch.Tensor,
                      expert_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The routed experts' output [T, H] on what the router and the experts get ([T, H], and [T, H'] for experts
        that read a projection), ``expert_mask`` experts removed from the selection (before [`output_scale`][]):
        the experts module called as transformers' ExpertsInterface calls it."""
        _, weights, index = self.route(layer, router_input, expert_mask)
        return layer.experts(expert_input, index, weights.to(expert_input.dtype))

    def observed_block(self, layer: MoELayer, observe: Callable[..., torch.Tensor],
                       expert_rows: Callable[..., torch.Tensor]) -> Callable[..., Any] | None:
        """A forward for ``layer.block`` while calibration observes the layer, for a family whose experts do not
        dispatch through transformers' ExpertsInterface (None, the default: they do, and are observed there).

        It returns what the block's forward returns (Llama 4's op for op; Ergo's with its experts run per expert by
        the family) and calls ``observe(hidden [T, H], top_k_index [T, k],
        top_k_weights [T, k], run)`` once, ``run(rows)`` giving the selected experts' outputs [T, k, H] and those of
        the (tokens, experts) ``rows`` [n, H] (None: none asked), as the observer must see them (Llama 4: each
        expert's contribution, weights 1). ``expert_rows(experts, hidden [T, H], tokens [n], expert ids [n])`` runs a
        fused experts module's MLP on those rows, grouped by expert (calibration's own)."""
        return None

    def selected_rows(self, layer: MoELayer, hidden: torch.Tensor, tokens: torch.Tensor, ids: torch.Tensor,
                      expert_rows: Callable[..., torch.Tensor]) -> torch.Tensor:
        """Unweighted outputs [n, H] of ids the router selects, row i id ``ids[i]`` on ``hidden[tokens[i]]``:
        ``expert_rows(layer.experts, hidden, tokens, ids)``; a family with identity experts gives their rows their
        input."""
        return expert_rows(layer.experts, hidden, tokens, ids)

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor, selected: torch.Tensor,
                       routing_state: Any = None) -> RemovalEffect:
        """Which single-expert removals can change a token's routing and how ([`RemovalEffect`][]).
        ``routing_state``: what [`observed_router`][] kept in the router call that gave these logits (None: none).

        The default re-runs the selection for the selected experts alone where `unselected_removal_is_free`,
        else for every expert (exact, E selections per token). A family with a closed form overrides it: a plain
        softmax rescales by 1 / (1 - p_j), growth p_j / (1 - p_j)
        (`lightprune.models.routing_ops.softmax_removal_growth`), softmax top-k promotes the (k+1)-th expert,
        a group-limited router can change its groups only through an expert among a chosen group's top scores.
        """
        if self.unselected_removal_is_free:
            return RemovalEffect(rerun=selected)
        return RemovalEffect(rerun=torch.arange(layer.num_experts, device=router_logits.device)
                             .expand(router_logits.shape[0], -1))

    def route(self, layer: MoELayer, hidden_states: torch.Tensor,
              expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        """Run the family's routing on ``hidden_states`` [T, H] with ``expert_mask`` experts removed.

        Equals ``layer.router(hidden_states)`` exactly when the mask is None or all False. An [E] mask that keeps
        what a plan may keep ([`keeps_a_layer`][]) routes as the structurally pruned layer's router does, ties
        included ([`select_pruned`][]); any other mask (one per token row, a group-limited layer's single removal)
        as [`select`][] does, the masked experts at -inf.
        """
        logits = self.router_logits(layer, hidden_states)
        if expert_mask is not None and expert_mask.dim() == 1:
            kept = kept_experts(expert_mask)
            if self.keeps_a_layer(layer, kept):
                return self.select_pruned(layer, logits, kept)
        return self.select(layer, logits, expert_mask)

    def route_kept(self, layer: MoELayer, hidden_states: torch.Tensor, kept: torch.Tensor) -> RoutingOutput:
        """[`route`][] with only the experts ``kept`` (ascending ids, [`kept_experts`][] of an [E] mask), which
        must be a layer's worth ([`keeps_a_layer`][]: a plan's, checked when the mask is made)."""
        return self.select_pruned(layer, self.router_logits(layer, hidden_states), kept)

    @staticmethod
    def keeps_a_layer(layer: MoELayer, kept: torch.Tensor) -> bool:
        """True when the experts ``kept`` (ascending ids) form a layer its router runs on, as a plan's do: at least the
        layer's floor, and the same count in every group of a group-limited router."""
        if kept.numel() < layer.min_experts:
            return False
        if layer.n_group <= 1:
            return True
        counts = torch.bincount(kept.cpu() // (layer.num_experts // layer.n_group), minlength=layer.n_group)
        return bool((counts == counts[0]).all())

    def select_kept(self, layer: MoELayer, kept_logits: torch.Tensor, kept: torch.Tensor) -> RoutingOutput:
        """The selection of the layer pruned to the experts ``kept`` (ascending ids): ``kept_logits`` [T, E'] are the
        kept experts' logits (then any identity experts': [`MoELayer.router_rows`][]), the ids returned positions
        among them, the first output as wide.

        It must run the ops the family's router runs on the pruned layer's tensors (``torch.topk`` breaks ties by
        position in a tensor of that size): the default, [`select`][] without a mask, is that for a family whose
        selection reads no per-expert tensor but the logits (group-limited routers keep their group count: each group
        keeps the same number of experts). A family whose selection reads per-expert tensors (a selection bias,
        per-expert scales) overrides it with their ``kept`` entries (`kept_entries`)."""
        return self.select(layer, kept_logits, None)

    def select_pruned(self, layer: MoELayer, router_logits: torch.Tensor, kept: torch.Tensor) -> RoutingOutput:
        """What the router of the layer pruned to ``kept`` (ascending ids) selects from ``router_logits`` [T, E], in
        the layer's expert ids: [`select_kept`][] on the kept columns, its positions mapped back to ids and its
        first output scattered back to [T, E] (-inf at the removed experts; 0 where the router returns probabilities).

        Selecting on all E columns with the removed ones at -inf would pick the same experts but for exact ties,
        which ``torch.topk`` breaks differently in a tensor of another size. A family that reads per-expert tensors in
        its selection but keeps the default [`select_kept`][] is masked over all E (ties may differ)."""
        kept = kept.to(router_logits.device)
        if kept.numel() == layer.num_experts:
            return self.select(layer, router_logits, None)
        if type(self).select_kept is MoEFamily.select_kept and self._reads_expert_tensors(layer):
            mask = torch.ones(layer.num_experts, dtype=torch.bool, device=router_logits.device)
            return self.select(layer, router_logits, mask.index_fill_(0, kept, False))
        rows = layer.router_rows(kept)  # any identity experts' columns stay, after the kept ones
        first, weights, positions = self.select_kept(layer, router_logits.index_select(-1, rows), kept)
        fill = float("-inf") if self.router_returns_logits else 0.0
        full = first.new_full((*first.shape[:-1], router_logits.shape[-1]), fill).index_copy(-1, rows, first)
        return full, weights, rows[positions]

class SelectsWithExpertTensor:
    """Mixin (first among the bases) of a family whose selection reads one per-expert tensor besides the logits (a
    correction bias, per-expert scales): it implements ``_select(layer, logits, mask, tensor)`` and, for a tensor
    other than the router's correction bias, [`selection_tensor`][]; ``select`` runs that with the layer's tensor,
    ``select_kept`` with the kept experts' entries (what the pruned layer's router holds: `kept_entries`)."""

    def selection_tensor(self, layer: MoELayer) -> torch.Tensor:
        """The per-expert tensor [E] the selection reads: the router's ``e_score_correction_bias`` unless the family
        says otherwise."""
        return layer.router.e_score_correction_bias

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        return self._select(layer, router_logits, expert_mask, self.selection_tensor(layer))

    def select_kept(self, layer: MoELayer, kept_logits: torch.Tensor, kept: torch.Tensor) -> RoutingOutput:
        return self._select(layer, kept_logits, None, kept_entries(self.selection_tensor(layer), kept))


class SelectsKept:
    """Mixin (first among the bases) of a family whose ``_select(layer, logits, mask, kept)`` takes the kept experts'
    per-expert tensors itself (``kept`` None: the layer's own): ``select`` runs it on the layer, ``select_kept`` on
    the kept experts' logits."""

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        return self._select(layer, router_logits, expert_mask, None)

    def select_kept(self, layer: MoELayer, kept_logits: torch.Tensor, kept: torch.Tensor) -> RoutingOutput:
        return self._select(layer, kept_logits, None, kept)


def _stored_shape(router: nn.Module) -> torch.Size:
    """The full shape of the router's stored weight [E, H], read without computing anything.

    Looks through adapter wrappers (``base_layer`` chains) and a torch parametrization to the stored
    parameter, and for a DeepSpeed ZeRO-3 partition (shape [0] outside a gather) reads its ``ds_shape``.
    """
    while isinstance(getattr(router, "base_layer", None), nn.Module):
        router = router.base_layer
    params = getattr(router, "parametrizations", None)
    weight = params.weight.original if params is not None and "weight" in params else router.weight
    return getattr(weight, "ds_shape", None) or weight.shape


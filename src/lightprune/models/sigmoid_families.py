"""Routers that select on per-expert sigmoid scores plus a correction bias (kept by the router or by the MoE block)
and renormalise the chosen scores: MiniMax-M2 / M3-VL, Hunyuan 3, AFMoE, LFM2-MoE, Laguna.

Each selects through one function of the bias it is given: the layer's own bias (`select`), or its kept experts'
entries on the kept experts' logits (`select_kept`, what the pruned layer's router computes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightprune.models.base import MoEFamily, SelectsKept, SelectsWithExpertTensor
from lightprune.models.family_rows import family_row
from lightprune.models.layer import MoELayer, RoutingOutput, kept_entries
from lightprune.models.routing_ops import mask_logits, masked_choice, renormalized, sigmoid_biased_topk

__all__ = ["Kolibri1_1Family", "LagunaFamily", "MiniMaxM2Family", "MiniMaxM3VLTextFamily", "HYV3Family", "AfmoeFamily",
           "Lfm2MoeFamily", "FlintFamily", "Kolibri1Family", "Inkling2TextFamily", "Inkling2Family",
           "Inkling2LoopTextFamily", "Inkling2LoopFamily", "MuseSparkFamily"]


class LagunaFamily(SelectsWithExpertTensor, MoEFamily):
    """Laguna (``laguna``): fp32 logits, optionally soft-capped (``moe_router_logit_softcapping``), sigmoid, top-k of
    the scores plus the router's ``e_score_correction_bias``, renormalised, cast to the hidden states' dtype
    (LagunaTopKRouter); the block multiplies the routed sum by ``moe_routed_scaling_factor`` after the experts;
    sparse layers from ``mlp_layer_types``; shared experts. Masking sets the soft-capped logit to -inf (a cap of
    -inf would be finite) and the selection score to -inf."""

    routing = "(soft-capped) sigmoid + correction bias, top-k, renormalised; routed sum scaled"
    model_types = ("laguna",)
    score_function = "sigmoid"
    shared_attrs = ("shared_experts",)

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        router = layer.router
        logits = F.linear(hidden_states.reshape(-1, router.weight.shape[1]), router.weight).float()
        if router.router_logit_softcapping > 0.0:
            logits = torch.tanh(logits / router.router_logit_softcapping) * router.router_logit_softcapping
        return logits

    def _select(self, layer: MoELayer, router_logits: torch.Tensor, expert_mask: torch.Tensor | None,
                bias: torch.Tensor) -> RoutingOutput:
        router = layer.router
        router_logits = mask_logits(router_logits, expert_mask)
        scores = torch.sigmoid(router_logits)
        choice = masked_choice(scores, bias.to(scores.dtype), expert_mask)
        top_index = torch.topk(choice, layer.top_k, dim=-1)[1]
        weights = renormalized(scores.gather(-1, top_index))
        return router_logits, weights.to(router.weight.dtype), top_index

    def output_scale(self, layer: MoELayer) -> float:
        return float(layer.block.routed_scaling_factor)

    unselected_removal_is_free = True  # per-expert sigmoid scores, renormalised over the k


class MiniMaxM2Family(MoEFamily):
    """MiniMax-M2 (``minimax_m2``): every layer sparse; sigmoid of the fp32 logits, top-k of the scores plus the
    block's ``e_score_correction_bias`` (passed to the router, pruned with the experts), the k scores renormalised
    (MiniMaxM2TopKRouter). Masking: logit -inf (score 0) and selection score -inf."""

    routing = "sigmoid + block's correction bias, top-k, renormalised"
    model_types = ("minimax_m2",)
    num_experts_key = "num_local_experts"
    score_function = "sigmoid"
    block_sub_tensors = (("", "e_score_correction_bias", 0),)

    def is_sparse_layer(self, index: int) -> bool:
        return True

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = layer.router.weight
        return F.linear(hidden_states.reshape(-1, weight.shape[1]).to(weight.dtype), weight)

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        return self._select(router_logits, expert_mask, self.selection_bias(layer), layer.top_k)

    def select_kept(self, layer: MoELayer, kept_logits: torch.Tensor, kept: torch.Tensor) -> RoutingOutput:
        return self._select(kept_logits, None, kept_entries(self.selection_bias(layer), kept), layer.top_k)

    @staticmethod
    def _select(router_logits: torch.Tensor, expert_mask: torch.Tensor | None, bias: torch.Tensor,
                top_k: int) -> RoutingOutput:
        router_logits = mask_logits(router_logits, expert_mask)
        weights = torch.sigmoid(router_logits.float())
        choice = masked_choice(weights, bias, expert_mask)
        top_index = torch.topk(choice, top_k, dim=-1, sorted=False)[1]
        return router_logits, renormalized(weights.gather(1, top_index)), top_index

    def selection_bias(self, layer: MoELayer) -> torch.Tensor:
        """The correction bias added to the scores for selection only (MiniMax-M2: the block's)."""
        return layer.block.e_score_correction_bias

    unselected_removal_is_free = True  # per-expert sigmoid scores, renormalised over the k


class MiniMaxM3VLTextFamily(MiniMaxM2Family):
    """MiniMax-M3-VL's language model (``minimax_m3_vl_text``): MiniMax-M2's router with the correction bias on the
    router (pruned with its rows), shared experts, the routed sum times ``routed_scaling_factor`` in the block;
    sparse layers from ``mlp_layer_types``."""

    routing = "sigmoid + correction bias, top-k, renormalised; routed sum scaled"
    model_types = ("minimax_m3_vl_text",)
    shared_attrs = ("shared_experts",)
    block_sub_tensors = ()
    is_sparse_layer = MoEFamily.is_sparse_layer

    def selection_bias(self, layer: MoELayer) -> torch.Tensor:
        return layer.router.e_score_correction_bias

    def output_scale(self, layer: MoELayer) -> float:
        return float(layer.block.routed_scaling_factor)


class HYV3Family(SelectsWithExpertTensor, MoEFamily):
    """Hunyuan 3 (``hy_v3``): sigmoid of fp32 logits, top-k of the scores plus the block's
    ``e_score_correction_bias``, renormalised (+1e-20), times ``router_scaling_factor`` (HYV3TopKRouter); sparse
    layers from ``mlp_layer_types``; shared experts. Masking: logit -inf and selection score -inf."""

    routing = "sigmoid + block's correction bias, top-k, renormalised, scaled"
    model_types = ("hy_v3",)
    score_function = "sigmoid"
    shared_attrs = ("shared_experts",)
    block_sub_tensors = (("", "e_score_correction_bias", 0),)

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = layer.router.weight
        return F.linear(hidden_states.reshape(-1, weight.shape[1]).float(), weight.float())

    def selection_tensor(self, layer: MoELayer) -> torch.Tensor:
        return layer.block.e_score_correction_bias

    def _select(self, layer: MoELayer, router_logits: torch.Tensor, expert_mask: torch.Tensor | None,
                bias: torch.Tensor) -> RoutingOutput:
        return sigmoid_biased_topk(router_logits, bias, expert_mask, layer.top_k, 1e-20,
                                   layer.router.router_scaling_factor)

    unselected_removal_is_free = True  # per-expert sigmoid scores, renormalised over the k


class Inkling2TextFamily(HYV3Family):
    """Inkling 2's language model (``inkling2_text``): every layer sparse, no shared experts; the router keeps its
    weight in fp32 (``_keep_in_fp32_modules_strict``) and casts the hidden states up, sigmoid scores, top-k (unsorted)
    of the scores plus the router's ``e_score_correction_bias``, renormalised (+1e-20), times ``routed_scaling_factor``,
    left in fp32 (Inkling2TopKRouter). Masking: logit -inf and selection score -inf."""

    routing = "sigmoid of fp32 logits + correction bias, top-k, renormalised, scaled"
    model_types = ("inkling2_text",)
    num_experts_key = "n_routed_experts"
    shared_attrs = ()
    block_sub_tensors = ()

    def __init__(self, model):
        super().__init__(model)
        scoring = getattr(self.text_config, "scoring_func", "sigmoid")
        if scoring != "sigmoid":
            raise ValueError(f"{type(self).__name__}: scoring_func {scoring!r} is not supported (lightprune's rule for "
                             "this router is the sigmoid one)")

    def is_sparse_layer(self, index: int) -> bool:
        return True

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = layer.router.weight
        return F.linear(hidden_states.float().reshape(-1, weight.shape[1]), weight)

    def selection_tensor(self, layer: MoELayer) -> torch.Tensor:
        return layer.router.e_score_correction_bias  # the router's, not the block's (HYV3Family's)

    def _select(self, layer: MoELayer, router_logits: torch.Tensor, expert_mask: torch.Tensor | None,
                bias: torch.Tensor) -> RoutingOutput:
        return sigmoid_biased_topk(router_logits, bias, expert_mask, layer.top_k, 1e-20,
                                   layer.router.routed_scaling_factor)


Inkling2Family = family_row(__name__, Inkling2TextFamily, "inkling2",
                            "Inkling 2 (``inkling2``): its language model is ``inkling2_text`` (Inkling2TextModel, "
                            "Inkling2TopKRouter); image placeholders are its vision tokens.",
                            multimodal=True, language_model_type="inkling2_text", vision_token_keys=("image_token_id",))


Inkling2LoopTextFamily = family_row(
    __name__, Inkling2TextFamily, "inkling2_loop_text",
    "Inkling 2 Loop's language model (``inkling2_loop_text``): Inkling 2's router line for line "
    "(Inkling2LoopTopKRouter), every layer sparse; the layers from ``loop_layer_index_start`` to "
    "``loop_layer_index_end`` run ``loop_num_passes`` times per forward, so calibration observes each of their MoE "
    "blocks once per pass (its statistics cover every pass) and pruning an expert prunes it in every pass.",
    name="Inkling2LoopTextFamily")
Inkling2LoopFamily = family_row(__name__, Inkling2LoopTextFamily, "inkling2_loop",
                                "Inkling 2 Loop (``inkling2_loop``): its language model is ``inkling2_loop_text``; "
                                "image placeholders are its vision tokens.",
                                name="Inkling2LoopFamily", multimodal=True, language_model_type="inkling2_loop_text",
                                vision_token_keys=("image_token_id",))


class MuseSparkFamily(SelectsWithExpertTensor, MoEFamily):
    """Muse Spark (``muse_spark``; its language model ``muse_spark_text`` is built inside the MLLM only): fp32 logits
    (the router's weight kept in fp32) times ``output_multiplier``, sigmoid, top-k (unsorted) of the scores plus the
    router's ``e_score_correction_bias``, renormalised (+1e-15), times ``routed_scaling_factor`` (MuseSparkTopkRouter);
    the experts read a projected, normed copy of the tokens and norm each output (``post_expert_norm``, shared), the
    block projects the weighted sum back; sparse layers from ``mlp_layer_types``. Masking: the scaled logit -inf and
    the selection score -inf."""

    routing = "sigmoid of scaled fp32 logits + correction bias, top-k, renormalised, scaled"
    model_types = ("muse_spark",)
    num_experts_key = "num_local_experts"
    score_function = "sigmoid"
    multimodal = True
    language_model_type = "muse_spark_text"
    vision_token_keys = ("image_token_id", "video_token_id")
    unselected_removal_is_free = True  # per-expert sigmoid scores, renormalised over the k

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        router = layer.router
        hidden_states = hidden_states.reshape(-1, router.hidden_dim)
        logits = F.linear(hidden_states.type(torch.float32), router.weight.type(torch.float32))
        return logits * router.output_multiplier

    def _select(self, layer: MoELayer, router_logits: torch.Tensor, expert_mask: torch.Tensor | None,
                bias: torch.Tensor) -> RoutingOutput:
        router = layer.router
        return sigmoid_biased_topk(router_logits, bias, expert_mask, layer.top_k, router.norm_topk_prob_eps,
                                   router.routed_scaling_factor)


class AfmoeFamily(SelectsWithExpertTensor, MoEFamily):
    """AFMoE (``afmoe``): the router module keeps its linear in ``router.gate``; fp32 logits, sigmoid, top-k of the
    scores plus the block's ``expert_bias``, renormalised (+1e-20), times ``route_scale`` (AfmoeTokenChoiceRouter);
    layers from ``num_dense_layers`` on are sparse; shared experts. Masking: logit -inf and selection score -inf."""

    routing = "sigmoid + block's expert bias, top-k, renormalised, scaled"
    model_types = ("afmoe",)
    router_attr = "router"
    router_weight_attr = "gate"
    score_function = "sigmoid"
    shared_attrs = ("shared_experts",)
    block_sub_tensors = (("", "expert_bias", 0),)

    def is_sparse_layer(self, index: int) -> bool:
        return index >= int(self.text_config.num_dense_layers)

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        gate = layer.router.gate
        return gate(hidden_states.reshape(-1, hidden_states.shape[-1])).to(torch.float32)

    def selection_tensor(self, layer: MoELayer) -> torch.Tensor:
        return layer.block.expert_bias

    def _select(self, layer: MoELayer, router_logits: torch.Tensor, expert_mask: torch.Tensor | None,
                bias: torch.Tensor) -> RoutingOutput:
        router_logits = mask_logits(router_logits, expert_mask)
        scores = torch.sigmoid(router_logits)
        top_index = torch.topk(masked_choice(scores, bias, expert_mask), k=layer.top_k, dim=1)[1]
        top = renormalized(scores.gather(dim=1, index=top_index), 1e-20)
        return router_logits, top * layer.router.route_scale, top_index

    unselected_removal_is_free = True  # per-expert sigmoid scores, renormalised over the k


class Lfm2MoeFamily(SelectsKept, MoEFamily):
    """LFM2-MoE (``lfm2_moe``): sigmoid of the logits, top-k of the scores (plus the block's ``expert_bias`` when
    ``use_expert_bias``), renormalised (+1e-6) when ``norm_topk_prob``, times ``routed_scaling_factor``
    (Lfm2MoeTopKRouter); layers from ``num_dense_layers`` on are sparse. Masking: logit -inf, selection -inf."""

    routing = "sigmoid (+ block's expert bias), top-k, renormalised, scaled"
    model_types = ("lfm2_moe",)
    mlp_attr = "feed_forward"
    score_function = "sigmoid"
    block_sub_tensors = (("", "expert_bias", 0),)

    def is_sparse_layer(self, index: int) -> bool:
        return index >= int(self.text_config.num_dense_layers)

    def _select(self, layer: MoELayer, router_logits: torch.Tensor, expert_mask: torch.Tensor | None,
                kept: torch.Tensor | None) -> RoutingOutput:
        """The rule; ``kept``: the logits are the kept experts' columns, the bias taken at ``kept``."""
        router, cfg = layer.router, self.text_config
        router_logits = mask_logits(router_logits, expert_mask)
        weights = router_logits.sigmoid()
        if router.use_expert_bias:
            bias = layer.block.expert_bias if kept is None else kept_entries(layer.block.expert_bias, kept)
            top_index = torch.topk(masked_choice(weights, bias, expert_mask), k=layer.top_k, dim=-1)[1]
            weights = torch.gather(weights, dim=1, index=top_index).type_as(router_logits)
        elif expert_mask is None:
            weights, top_index = torch.topk(weights, k=layer.top_k, dim=-1)
        else:  # a masked expert's score is 0, never above a kept one's: select on -inf to be exact
            top_index = torch.topk(masked_choice(weights, None, expert_mask), k=layer.top_k, dim=-1)[1]
            weights = torch.gather(weights, dim=1, index=top_index)
        if cfg.norm_topk_prob:
            weights = renormalized(weights, 1e-6)
        return router_logits, weights * router.routed_scaling_factor, top_index

    unselected_removal_is_free = True  # per-expert sigmoid scores, the k renormalised or not


class FlintFamily(MoEFamily):
    """Flint (``flint``): fp32 logits computed outside any autocast (the router's weight kept in fp32), sigmoid, top-k
    of the scores, renormalised (no epsilon) when ``norm_topk_prob``, the weights left in fp32 (FlintTopKRouter); no
    selection bias. Sparse layers by Qwen3-MoE's rule (``mlp_only_layers``, ``decoder_sparse_step``), a shared
    expert added ungated. Masking: logit -inf (score 0) and selection score -inf."""

    routing = "sigmoid of fp32 logits, top-k, renormalised when norm_topk_prob"
    model_types = ("flint",)
    shared_attrs = ("shared_expert",)
    score_function = "sigmoid"

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        router = layer.router
        hidden_states = hidden_states.reshape(-1, router.weight.shape[1])
        with torch.autocast(device_type=hidden_states.device.type, enabled=False):
            return F.linear(hidden_states.float(), router.weight.float())

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router_logits = mask_logits(router_logits, expert_mask)
        scores = router_logits.sigmoid()
        if expert_mask is None:
            weights, top_index = torch.topk(scores, layer.top_k, dim=-1)
        else:  # a masked expert's score is 0, never above a kept one's: select on -inf to be exact
            top_index = torch.topk(masked_choice(scores, None, expert_mask), layer.top_k, dim=-1)[1]
            weights = torch.gather(scores, dim=1, index=top_index)
        if layer.router.norm_topk_prob:
            weights = renormalized(weights)
        return router_logits, weights, top_index

    unselected_removal_is_free = True  # per-expert sigmoid scores, the k renormalised or not


class Kolibri1Family(SelectsWithExpertTensor, MoEFamily):
    """Kolibri 1 (``kolibri1``): fp32 logits (on CUDA, for bf16 hidden states and weight without grad, a bf16 GEMM
    with fp32 output, as the router computes them there), top-k of the logits plus the router's
    ``e_score_correction_bias`` (pruned with the experts), sigmoid of the k chosen logits, renormalised (no epsilon)
    when ``norm_topk_prob`` (Kolibri1TopKRouter); every layer sparse, shared experts added ungated. Masking: logit
    -inf and selection score -inf."""

    routing = "top-k of fp32 logits + correction bias, sigmoid of the k, renormalised when norm_topk_prob"
    model_types = ("kolibri1",)
    shared_attrs = ("shared_experts",)
    score_function = "sigmoid"

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        router = layer.router
        weight = router.weight
        hidden_states = hidden_states.reshape(-1, weight.shape[1])
        if (hidden_states.is_cuda and hidden_states.dtype == weight.dtype and not torch.is_grad_enabled()
                and _torch_at_least("2.8.0")):
            return torch.mm(hidden_states, weight.t(), out_dtype=torch.float32)
        return F.linear(hidden_states.type(torch.float32), weight.type(torch.float32))

    def _select(self, layer: MoELayer, router_logits: torch.Tensor, expert_mask: torch.Tensor | None,
                bias: torch.Tensor) -> RoutingOutput:
        """The rule with the correction bias ``bias`` (the layer's, or its kept experts' entries)."""
        router_logits = mask_logits(router_logits, expert_mask)
        top_index = torch.topk(masked_choice(router_logits, bias, expert_mask), layer.top_k, dim=-1)[1]
        scores = router_logits.gather(1, top_index).sigmoid()
        if layer.router.norm_topk_prob:
            scores = renormalized(scores)
        return router_logits, scores, top_index

    unselected_removal_is_free = True  # top-k of the biased logits, a sigmoid of each chosen one


Kolibri1_1Family = family_row(__name__, Kolibri1Family, "kolibri1_1",
                              "Kolibri 1.1 (``kolibri1_1``): Kolibri 1's router and MoE block (Kolibri1_1TopKRouter "
                              "and Kolibri1_1SparseMoeBlock are the same code), its indexed and shared-KV attention "
                              "aside; the layers in ``mlp_only_layers`` dense (the base rule).",
                              name="Kolibri1_1Family")


def _torch_at_least(version: str) -> bool:
    """transformers' ``is_torch_greater_or_equal``: the check the Kolibri routers make."""
    from transformers.utils import is_torch_greater_or_equal

    return bool(is_torch_greater_or_equal(version))

"""DeepSeek-V3's router and the families that compute it (sigmoid scores, a correction bias for selection,
group-limited top-k, scaling; the rule itself in `deepseek_v3_routing`): the models whose transformers router is
the same computation (rows of `family_row`). Its variants with a group rule of their own are in
`group_limited_families`, DeepSeek-V2 (softmax, greedy or group-limited greedy) in `deepseek_v2_family`."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from lightprune.models.base import MoEFamily, RemovalEffect
from lightprune.models.deepseek_v3_routing import (
    RENORM_EPS,
    GroupTop,
    choose_groups,
    group_scores,
    group_top,
    routed_weights,
    select_from_group_top,
    select_from_scores,
    select_without_one,
    selection_scores,
)
from lightprune.models.family_rows import family_row
from lightprune.models.layer import MoELayer, RoutingOutput, kept_entries, mlp_layer_type
from lightprune.models.sorted_top import sorted_topk

__all__ = ["GroupTop", "DeepseekV3Family", "Glm4MoeFamily", "SarvamMoeFamily", "Param2MoeFamily", "SarvamMlaFamily",
           "Glm4vMoeFamily", "KimiK25Family", "NemotronHFamily", "Dots1Family", "DEEPSEEK_ALIKE", "Dots3NoteTextFamily",
           "MiniCPM5MoeFamily"]


class DeepseekV3Family(MoEFamily):
    """DeepSeek-V3: sigmoid scores, correction bias for selection only, group-limited top-k,
    optional renormalisation, then ``routed_scaling_factor``.

    Masking sets the expert's logit to -inf (score 0) and its selection score to -inf (the
    correction bias alone could otherwise still select it), so a masked expert takes no part in
    group scores or selection: exactly the model with that expert removed.
    """

    routing = "sigmoid + correction bias, group-limited top-k, scaled"
    model_types = ("deepseek_v3",)
    num_experts_key = "n_routed_experts"
    shared_attrs = ("shared_experts",)
    group_limited = True

    def is_sparse_layer(self, index: int) -> bool:
        cfg = self.text_config
        listed = mlp_layer_type(cfg, index)
        if listed is not None:
            return listed
        return index >= int(getattr(cfg, "first_k_dense_replace", 0) or 0)

    def group_limits(self) -> tuple[int, int]:
        cfg = self.text_config
        return int(cfg.n_group or 1), int(cfg.topk_group or 1)

    score_function = "sigmoid"

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        router = layer.router
        hidden_states = hidden_states.view(-1, router.weight.shape[1])
        return F.linear(hidden_states.type(torch.float32), router.weight.type(torch.float32))

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        """The rule from all E scores (`select_from_scores`)."""
        return select_from_scores(layer.router, router_logits, expert_mask)

    def select_kept(self, layer: MoELayer, kept_logits: torch.Tensor, kept: torch.Tensor) -> RoutingOutput:
        """The rule on the kept experts' logits and correction bias entries, in the pruned layer's groups (the same
        group count, each group its kept experts)."""
        router = layer.router
        return select_from_scores(router, kept_logits, None, kept_entries(router.e_score_correction_bias, kept))

    def select_without(self, layer: MoELayer, router_logits: torch.Tensor, tokens: torch.Tensor,
                       experts: torch.Tensor) -> RoutingOutput:
        """`select` with one expert removed per (token, expert) row, from each group's top k + 1 (at least 3) selection
        scores c instead of all E (`select_without_one`); the rows whose chosen groups hold fewer than k experts (the
        router fills up from the rest) by `select` on a mask. The logits returned are the rows of ``router_logits``,
        unmasked."""
        top_weights, top_index, short = select_without_one(layer.router, router_logits, tokens, experts)
        if bool(short.any()):
            _, weights, index = super().select_without(layer, router_logits, tokens[short], experts[short])
            top_weights[short], top_index[short] = weights.to(top_weights.dtype), index
        return router_logits[tokens], top_weights, top_index

    def observed_router(self, layer: MoELayer, keep: Callable[[Any], None]) -> Callable[..., Any] | None:
        """The router's forward computed as `removal_effect` needs it: the group scores from each group's sorted top
        k + 1 (`GroupTop`, kept with the scores and the chosen groups), the other groups' selection scores at -inf by
        adding -inf (`select_from_group_top`). Bit for bit the router's output; a batch with NaN logits runs the
        router's own forward. None for a router that does not compute what DeepSeek-V3's does (its forward already
        replaced, say by a device hook)."""
        router = layer.router
        if "forward" in vars(router) or not hasattr(router, "e_score_correction_bias"):
            return None
        original = type(router).forward

        def forward(hidden_states: torch.Tensor):
            logits = self.router_logits(layer, hidden_states)
            if bool(torch.isnan(logits).any()):
                return original(router, hidden_states)
            weights, selected, top = select_from_group_top(router, logits)
            keep(top)
            return logits, weights, selected

        return forward

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor, selected: torch.Tensor,
                       routing_state: Any = None) -> RemovalEffect:
        """Sigmoid scores are per expert, so a removal changes the routing only through the selection, and the chosen
        groups only through a group's score, the sum of its top-2 selection scores c. Removing expert j:

        - j among the top 2 of a chosen group g whose score without j (the top-3 sum less c_j; -inf without a third
          expert) is below the best unchosen group r's score: g leaves the chosen groups and r enters, whichever of
          the two leaves (the other is the slot's ``rerun_alias``), and the new selection is the top k of the other
          chosen groups' and r's lists, computed here for every (token, chosen group) at once; equal to r's score
          (a tie the router breaks), or no closed form (the groups hold fewer than k experts): re-run
          (`select_without`);
        - else, j selected: the k - 1 others stay and the best unselected expert n of the chosen groups enters (when
          the chosen groups hold no unselected expert, the selection is re-run);
          weights are scores s (sigmoid, no bias) times the scaling factor, renormalised over the selected ones when
          ``norm_topk_prob``: then the others' factor is (s_j - s_n) / (S - s_j + s_n), S the selected score sum;
        - else nothing changes.

        ``routing_state``: the `GroupTop` of these logits that `observed_router` kept (else computed).
        """
        router = layer.router
        num_group, num_experts = router.num_group, router_logits.shape[-1]
        k, picked = selected.shape[1], router.topk_group
        num_tokens, device = router_logits.shape[0], router_logits.device
        # each group's top k + 1 (at least 3) selection scores, sorted: a group holds at most k selected experts, so
        # its best unselected one is in its list
        top = routing_state if isinstance(routing_state, GroupTop) else None
        scores = top.scores if top is not None and top.scores is not None else router_logits.sigmoid()
        if top is None:
            top = group_top(selection_scores(scores, router.e_score_correction_bias), num_group, k)
        top_values, top_ids = top.values, top.ids                                            # [T, G, w]
        width = top_values.shape[-1]
        scored = group_scores(top_values)                                                    # [T, G]
        chosen_idx = top.chosen if top.chosen is not None else choose_groups(scored, picked)  # [T, Gc]
        gather = lambda t: t.gather(1, chosen_idx.unsqueeze(-1).expand(-1, -1, t.shape[-1]))  # noqa: E731
        values, ids = gather(top_values), gather(top_ids)                                   # [T, Gc, w]
        rerun = selected[:, :0]
        alias = new_weights = new_selected = None
        if num_group > picked:
            chosen = torch.zeros_like(scored, dtype=torch.bool).scatter_(1, chosen_idx, True)
            rival_score, rival = scored.masked_fill(chosen, float("-inf")).max(dim=-1)
            third = values[..., 2] if width >= 3 else torch.full_like(values[..., 0], float("-inf"))
            without = torch.stack([values[..., 1] + third, values[..., 0] + third], dim=-1)  # [T, Gc, 2]: less each
            falls = without <= rival_score.view(-1, 1, 1)
            # a group gives at most k experts to a top k: the pools of the new groups hold each one's first k
            pool_width = min(width, k)
            # a strict fall of the top-1 removal has the closed form (the top-2 removal's score is not lower)
            closed = (without[..., 0] < rival_score.view(-1, 1)) & (picked * pool_width >= k)  # [T, Gc]
            both = closed & (without[..., 1] < rival_score.view(-1, 1))
            pair_ids = torch.where(falls, ids[..., :2], -1)
            pair_ids[..., 1] = torch.where(both, -1, pair_ids[..., 1])
            alias = torch.stack([torch.where(both, ids[..., 1], -1), torch.full_like(both, -1, dtype=ids.dtype)],
                                dim=-1).flatten(1)
            rerun = pair_ids.flatten(1)                                                      # [T, 2 Gc]
            # for each (token, chosen group c) of the closed form, the new groups: the chosen ones with c replaced by
            # the rival; the new selection: the top k of their lists
            new_selected = torch.zeros(num_tokens, picked, 2, k, dtype=selected.dtype, device=device)
            new_weights = torch.zeros(num_tokens, picked, 2, k, dtype=scores.dtype, device=device)
            tokens, slot = closed.nonzero(as_tuple=True)
            if tokens.numel():
                groups = chosen_idx.index_select(0, tokens).scatter(1, slot.unsqueeze(-1),
                                                                    rival.index_select(0, tokens).unsqueeze(-1))
                # rows (token, group) of the [T G, w] lists, by index_select (faster than indexing on a CPU)
                at = (tokens.unsqueeze(-1) * num_group + groups).view(-1)
                pool = lambda t: t.flatten(0, 1).index_select(0, at)[:, :pool_width].reshape(len(tokens), -1)  # noqa
                pool_values, pool_ids = pool(top_values), pool(top_ids)                                # [n, Gc w']
                swapped = pool_ids.gather(1, sorted_topk(pool_values, k)[1])                         # [n, k]
                into = tokens * (picked * 2) + slot * 2                     # row (token, slot, 0) of [T, Gc, 2, k]
                new_selected.view(-1, k).index_copy_(0, into, swapped)
                new_weights.view(-1, k).index_copy_(0, into, routed_weights(
                    router, scores.view(-1).index_select(0, (tokens.unsqueeze(-1) * num_experts + swapped).view(-1))
                    .view(-1, k)))
            new_selected, new_weights = new_selected.flatten(1, 2), new_weights.flatten(1, 2)
            generic = (rerun >= 0) & ~torch.stack([closed, torch.zeros_like(closed)], dim=-1).flatten(1)
        # the expert a swap promotes: the best unselected one of the chosen groups' lists
        is_selected = torch.zeros(num_tokens, num_experts, dtype=torch.bool, device=device).scatter_(1, selected, True)
        listed = ids.flatten(1)
        best, at = values.flatten(1).masked_fill(is_selected.gather(1, listed), float("-inf")).max(dim=-1,
                                                                                                 keepdim=True)
        promoted = listed.gather(1, at)
        none_left = torch.isneginf(best)  # the chosen groups hold only selected experts: no swap, re-run them
        if bool(none_left.any()):
            extra = torch.where(none_left, selected, -1)
            rerun = torch.cat([rerun, extra], dim=1)
            if new_selected is not None:
                alias = torch.cat([alias, torch.full_like(extra, -1)], dim=1)
                new_selected = torch.cat([new_selected, selected.new_zeros(num_tokens, k, k)], dim=1)
                new_weights = torch.cat([new_weights, new_weights.new_zeros(num_tokens, k, k)], dim=1)
                generic = torch.cat([generic, extra >= 0], dim=1)
        if new_selected is not None:
            rows, slots = generic.nonzero(as_tuple=True)
            if rows.numel():
                _, weights, index = self.select_without(layer, router_logits, rows, rerun[rows, slots])
                new_weights[rows, slots], new_selected[rows, slots] = weights.to(new_weights.dtype), index
        s_sel, s_next = scores.gather(1, selected), scores.gather(1, promoted)
        scale = router.routed_scaling_factor
        if router.norm_topk_prob:
            denom = s_sel.sum(dim=-1, keepdim=True) - s_sel + s_next + RENORM_EPS
            factor, weight = (s_sel - s_next) / denom, s_next / denom * scale
        else:
            factor, weight = torch.zeros_like(s_sel), (s_next * scale).expand(-1, k)
        return RemovalEffect(rerun=rerun, swap_factor=factor, swap_expert=promoted.squeeze(-1), swap_weight=weight,
                             rerun_weights=new_weights, rerun_selected=new_selected, rerun_alias=alias)


class NemotronHFamily(DeepseekV3Family):
    """Nemotron-H / Nemotron 3 (``nemotron_h``): DeepSeek-V3's router (NemotronHTopkRouter is the same computation)
    in the layers whose ``layers_block_type`` is "moe" (the others are Mamba-2, attention or MLP mixers); ungated
    relu^2 experts (``up_proj``, ``down_proj``), fed a latent projection of the router's input when
    ``moe_latent_size`` is set."""

    model_types = ("nemotron_h",)
    mlp_attr = "mixer"

    def is_sparse_layer(self, index: int) -> bool:
        return self.text_config.layers_block_type[index] == "moe"


class MiniCPM5MoeFamily(DeepseekV3Family):
    """MiniCPM 5 MoE (``minicpm5_moe``): DeepSeek-V3's router (MiniCPM5MoeTopkRouter is its computation) with the fp32
    logits computed outside any autocast, as that router forces them; the dense-layer rule of ``mlp_layer_types``."""

    model_types = ("minicpm5_moe",)

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=hidden_states.device.type, enabled=False):
            return super().router_logits(layer, hidden_states)


# ------------------------------------------------------------------------------------------------ the table rows
# families whose transformers router computes what DeepSeek-V3's does (its forward, line for line), with DeepSeek-V3's
# attribute names and dense-layer rule (first_k_dense_replace or the config's mlp_layer_types): one row each
_IMAGES_AND_VIDEOS = ("image_token_id", "video_token_id")
_V3_ROUTER = "DeepSeek-V3's router (sigmoid, correction bias, groups, scaling)."

Glm4MoeFamily = family_row(__name__, DeepseekV3Family, "glm4_moe",
                           "GLM-4.5 / 4.6 (``glm4_moe``): DeepSeek-V3's router (Glm4MoeTopkRouter is the same "
                           "computation).")
SarvamMoeFamily = family_row(__name__, DeepseekV3Family, "sarvam_moe",
                             "Sarvam-30B (``sarvam_moe``): transformers builds it as a GLM-4.5 model "
                             "(Glm4MoeForCausalLM with a SarvamMoEConfig), so DeepSeek-V3's router.")
Param2MoeFamily = family_row(__name__, DeepseekV3Family, "param2moe",
                             "Param-2 MoE (``param2moe``): transformers builds it as a GLM-4.5 model "
                             "(Glm4MoeForCausalLM with a Param2MoeConfig), so DeepSeek-V3's router.")
SarvamMlaFamily = family_row(__name__, DeepseekV3Family, "sarvam_mla",
                             "Sarvam-105B (``sarvam_mla``): transformers builds it as a DeepSeek-V3 model "
                             "(DeepseekV3ForCausalLM with a SarvamMLAConfig), so DeepSeek-V3's router.")
Glm4vMoeFamily = family_row(__name__, DeepseekV3Family, "glm4v_moe",
                            "GLM-4.5V / 4.6V (``glm4v_moe``): a GLM-4.5 language model (DeepSeek-V3's router) with "
                            "image and video placeholders.",
                            multimodal=True, vision_token_keys=_IMAGES_AND_VIDEOS)
KimiK25Family = family_row(__name__, DeepseekV3Family, "kimi_k25",
                           "Kimi K2.5 / K2.6 (``kimi_k25``): a DeepSeek-V3 language model (``text_config.model_type`` "
                           "deepseek_v3) behind a MoonViT vision tower; images and videos are its vision tokens.",
                           multimodal=True, language_model_type="deepseek_v3", vision_token_keys=_IMAGES_AND_VIDEOS)
Dots1Family = family_row(__name__, DeepseekV3Family, "dots1",
                         "dots.llm1 (``dots1``): DeepSeek-V3's router and dense-layer rule.")
#: the rows registered by model type only (no name of their own here); settings: the config key counting the experts
DEEPSEEK_ALIKE: tuple[type[MoEFamily], ...] = tuple(
    family_row(__name__, DeepseekV3Family, model_type, f"``{model_type}``: {_V3_ROUTER}", **settings)
    for model_type, settings in (
        ("exaone_moe", {"num_experts_key": "num_experts"}),
        ("solar_open", {}),
        ("mimo_v2_flash", {}),
        ("hy_v4", {}),
        ("deepseek_v32", {}),
        ("glm_moe_dsa", {}),
        ("glm4_moe_lite", {}),
        ("axk1", {}),
        ("kimi_linear", {"num_experts_key": "num_local_experts"}),
        ("bailing_hybrid", {"num_experts_key": "num_local_experts"}),
    ))
Dots3NoteTextFamily = family_row(__name__, DeepseekV3Family, "dots3_note_text", f"``dots3_note_text``: {_V3_ROUTER}")

"""The model types lightprune refuses, and why: structures it cannot prune exactly yet (the error for such a type
says the reason; [`lightprune.models.registry.refuse_family`][..registry.refuse_family] adds one)."""

from __future__ import annotations

__all__ = ["REFUSED_TYPES"]

#: model types whose structure lightprune cannot prune exactly yet, and why (:func:`registry.refuse_family`)
REFUSED_TYPES: dict[str, str] = {
    "switch_transformers": "an encoder-decoder model whose experts are separate modules (no fused gate_up_proj / "
                           "down_proj); lightprune prunes decoder-only models with fused expert tensors",
    "nllb_moe": "an encoder-decoder model whose experts are separate modules (no fused gate_up_proj / down_proj); "
                "lightprune prunes decoder-only models with fused expert tensors",
    "jetmoe": "a mixture of attention heads besides its MLP experts, which are not stored as fused gate_up_proj / "
              "down_proj tensors",
    "ernie4_5_vl_moe": "each MoE layer holds two expert sets (text_moe and vision_moe, chosen per token by "
                       "moe_mm_token_type_ids); lightprune models one router and one expert set per layer",
    "deepseek_v4": "its first layers route by token id (hash MoE: tid2eid maps a token to fixed experts, so a removed "
                   "expert's tokens cannot be re-routed exactly) and it mixes hyper-connection streams around "
                   "every block",
    "zaya": "its router is an MLP with a state carried from layer to layer and a skip class, with no per-expert "
            "[E, H] router row to prune",
    "doge": "product-key experts (DogeCDMoE): the router holds 2 sqrt(E) key rows, not one row per expert (expert "
            "ix * K + iy scores x_ix + y_iy), and a model with fewer experts rebuilds its keys from floor(sqrt(E')), "
            "re-indexing every expert, so no subset of the experts is a model; its router also splits the flattened "
            "logits across tokens (view(2, B * S, -1))",
    "diffusion_gemma": "a block-diffusion model whose encoder and decoder layers share their expert parameters (the "
                       "same tensors, tied), routed by two stacks; lightprune prunes one decoder stack per model and "
                       "does not prune a tied pair yet",
    "inkling_text": "its router holds a row per routed expert and then one per shared expert ([E + S] rows) and "
                    "normalises the chosen routed experts' and every shared expert's scores together, so removing a "
                    "routed expert changes the shared experts' weights too; lightprune's surgery and Delta-H model "
                    "routed rows only, not yet these",
    "inkling_mm_model": "its language model is Inkling's (inkling_text), whose router holds a row per routed "
                        "expert and then one per shared expert ([E + S] rows) and normalises both kinds together; "
                        "lightprune's surgery and Delta-H model routed rows only, not yet these",
}

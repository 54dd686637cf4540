"""The model types lightprune refuses, and why: structures it cannot prune exactly yet (the error for such a type
says the reason; :func:`lightprune.models.registry.refuse_family` adds one)."""

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
    "dbrx": "its experts are not stored as per-expert gate_up_proj / down_proj tensors (a layout lightprune's "
            "surgery does not slice yet)",
    "llama4": "its router's sigmoid score scales each expert's input (f_j(s x), every expert run densely) rather "
              "than weighting the expert's output, and its experts do not dispatch through transformers' "
              "ExpertsInterface: lightprune's calibration criteria assume H = sum_j w_j f_j(x)",
    "llama4_text": "its router's sigmoid score scales each expert's input (f_j(s x), every expert run densely) "
                   "rather than weighting the expert's output, and its experts do not dispatch through "
                   "transformers' ExpertsInterface: lightprune's calibration criteria assume H = sum_j w_j f_j(x)",
    "ernie4_5_vl_moe": "each MoE layer holds two expert sets (text_moe and vision_moe, chosen per token by "
                       "moe_mm_token_type_ids); lightprune models one router and one expert set per layer",
    "longcat_flash": "zero-computation (identity) experts share the router with the routed ones ([E + Z] router "
                     "rows and gate_up_proj rows but [E] down_proj rows), and its experts do not dispatch through "
                     "transformers' ExpertsInterface",
    "deepseek_v4": "its first layers route by token id (hash MoE: tid2eid maps a token to fixed experts, so a removed "
                   "expert's tokens cannot be re-routed exactly) and it mixes hyper-connection streams around "
                   "every block",
    "zaya": "its router is an MLP with a state carried from layer to layer and a skip class, with no per-expert "
            "[E, H] router row to prune",
}

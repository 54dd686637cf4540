"""Why the refused MoE types are refused, shown on their own tiny models (built from transformers' configs, read
from the modules, not from lightprune): each test demonstrates the structure its refusal names, and that
``find_moe_layers`` refuses the type with that reason. Also: a type that is not a row because its config forbids
its MoE block (Gemma 4's assistant)."""

from __future__ import annotations

import pytest
import torch

import lightprune as lp
from lightprune.models import REFUSED
from lightprune.testing.text import _GENERIC_FAMILIES, _generic

#: a tiny Inkling language model: Inkling 2's attention sizes, one shared expert
_INKLING = {"swa_num_attention_heads": 4, "swa_num_key_value_heads": 2, "swa_head_dim": 8, "sliding_window_size": 4,
            "unpadded_vocab_size": 128, "d_rel": 4, "rel_extent": 16, "n_shared_experts": 1, "num_hidden_layers": 1}


def _refused_with_its_reason(model, model_type: str) -> None:
    with pytest.raises(ValueError) as err:
        lp.find_moe_layers(model)
    assert str(err.value) == f"lightprune cannot prune model_type {model_type!r} exactly yet: {REFUSED[model_type]}"


def test_doge_has_no_expert_rows_and_no_subset_of_its_experts_is_a_model() -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(_generic("doge", is_moe=True, num_experts=16, num_experts_per_tok=2,
                                                      num_hidden_layers=1))
    block = model.model.layers[0].mlp
    keys = block.num_keys
    assert keys == 4 and block.router_gate.weight.shape[0] == 2 * keys != 16  # two key sets, not a row per expert
    assert block.down_embed.weight.shape[0] == block.up_embed.weight.shape[0] == 16
    # remove one expert: the 15-expert model has floor(sqrt(15)) = 3 keys, so it reaches experts 0..8 only (id
    # ix * 3 + iy) and every kept expert id above 2 moves: the 15 kept experts are not a Doge model
    smaller = AutoModelForCausalLM.from_config(_generic("doge", is_moe=True, num_experts=15, num_experts_per_tok=2,
                                                        num_hidden_layers=1)).model.layers[0].mlp
    assert smaller.num_keys == 3 and smaller.router_gate.weight.shape[0] == 6
    reachable = {ix * smaller.num_keys + iy for ix in range(3) for iy in range(3)}
    kept = [expert for expert in range(16) if expert != 3]
    assert sorted(reachable) == list(range(9)) and set(kept) - reachable == set(range(9, 16))
    _refused_with_its_reason(model, "doge")


def test_inkling_weighs_its_shared_experts_with_the_routed_ones() -> None:
    """Inkling's router: [E + S] rows; removing a selected routed expert changes the shared experts' weights, which
    the router normalises together with the routed ones'."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(_generic("inkling_text", **_INKLING))
    block = model.model.layers[0].mlp
    routed = block.experts.gate_up_proj.shape[0]
    assert block.gate.weight.shape[0] == routed + block.shared_experts.n_shared_experts
    with torch.no_grad():
        torch.nn.init.normal_(block.gate.weight, std=0.5)
        hidden = torch.randn(6, block.gate.weight.shape[1], generator=torch.Generator().manual_seed(0))
        _, _, chosen, gammas = block.gate(hidden)
        block.gate.e_score_correction_bias[chosen[0, 0]] = -1e9  # remove token 0's first chosen expert
        _, _, again, gammas_without = block.gate(hidden)
    assert int(chosen[0, 0]) not in again[0].tolist()
    assert not torch.allclose(gammas[0], gammas_without[0])  # the shared experts' weights moved
    _refused_with_its_reason(model, "inkling_text")


def test_diffusion_gemma_ties_its_encoder_and_decoder_experts() -> None:
    from transformers import AutoModelForImageTextToText
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    text = _generic("diffusion_gemma_text", **_GENERIC_FAMILIES["gemma4_text"])
    config = CONFIG_MAPPING["diffusion_gemma"](text_config=text.to_dict(), vision_config={
        "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 2, "head_dim": 16})
    model = AutoModelForImageTextToText.from_config(config)
    shared: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if name.endswith("experts.gate_up_proj"):
            shared.setdefault(id(param), []).append(name)
    assert len(shared) == text.num_hidden_layers
    for names in shared.values():  # one tensor, two stacks
        assert sorted(n.split(".layers.")[0] for n in names) == ["model.decoder", "model.encoder.language_model"]
    _refused_with_its_reason(model, "diffusion_gemma")


def test_gemma4_assistant_cannot_have_an_moe_block() -> None:
    """Not a row of the conformance table: Gemma 4's assistant (a draft model) forces its MoE block off."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    text = {**_generic("gemma4_text", **_GENERIC_FAMILIES["gemma4_text"]).to_dict(), "vocab_size_per_layer_input": 0,
            "num_kv_shared_layers": 2}
    with pytest.raises(Exception, match="enable_moe_block"):
        CONFIG_MAPPING["gemma4_assistant"](text_config=text)
    assert CONFIG_MAPPING["gemma4_assistant"](text_config={**text, "enable_moe_block": False})

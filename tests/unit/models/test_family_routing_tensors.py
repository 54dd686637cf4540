"""Every registered family's routing tensors, from the family's own listing (``MoEFamily.routing_tensors``): the
listing holds every tensor of the router module and every per-expert tensor a prune slices beside the experts; every
other tensor of the MoE block is named below as one the routing does not read; and a NaN or an inf in any listed
tensor is refused by the one check every entry point runs (``check_routing_tensors``), naming it."""

from __future__ import annotations

import math
import re

import pytest
import torch

from lightprune.experts.prune import per_expert_tensors
from lightprune.models import FAMILIES, find_moe_layers
from lightprune.models.routing_check import check_routing_tensors, non_finite_routing_tensor
from lightprune.testing.tiny import TINY_FAMILIES

#: tensors of an MoE block (names inside it) besides its router, its routed experts and its shared experts that the
#: routing does not read, and why; a new family whose block holds another tensor fails here until it is listed by the
#: family (``router_sub_tensors`` / ``block_sub_tensors``) or named here
NOT_ROUTING = {
    "shared_expert_gate.weight": "the shared expert's sigmoid gate (Qwen2-MoE's rows): weighs the always-on expert",
    "fc1_latent_proj.weight": "Nemotron-H's latent projection of the experts' input",
    "fc2_latent_proj.weight": "Nemotron-H's projection of the experts' output back",
    "pre_expert_proj.weight": "Muse Spark's projection of the experts' input",
    "pre_expert_norm.weight": "Muse Spark's norm of the experts' input",
    "post_expert_proj.weight": "Muse Spark's projection of the routed sum back",
    "post_mlp_layernorm.weight": "A.X K1's norm of the block's output",
}
#: Gemma 4's MoE block is its decoder layer: its attention, norms, dense MLP and layer scale feed the router's input
#: (a hidden state, checked per token), they are not routing tensors
DECODER_LAYER_PARTS = ("self_attn.", "mlp.", "input_layernorm.", "post_attention_layernorm.",
                       "pre_feedforward_layernorm", "post_feedforward_layernorm", "layer_scalar")


def _value(model: torch.nn.Module, name: str) -> torch.Tensor:
    owner, _, attr = name.rpartition(".")
    return getattr(model.get_submodule(owner), attr)


def test_every_registered_family_has_a_tiny_model() -> None:
    """The listing test below covers the registered families through their tiny models."""
    assert sorted(FAMILIES) == sorted(TINY_FAMILIES)


def test_every_registered_familys_routing_tensors_are_listed_and_refused(tiny) -> None:
    checked = {}
    for family in TINY_FAMILIES:
        model = tiny(family)
        layer = find_moe_layers(model)[-1]
        listing = layer.family.routing_tensors(layer)
        names = [found.name for found in listing]
        assert len(names) == len(set(names)), (family, names)
        assert all(found.tensor is _value(model, found.name) for found in listing), family  # names in the model
        listed = {id(found.tensor) for found in listing}
        router = [*layer.router.parameters(), *layer.router.buffers()]
        assert all(id(t) in listed for t in router), family
        sliced = [getattr(t.module, t.name) for t in per_expert_tensors(layer) if t.routing]
        assert all(id(t) in listed for t in sliced), family
        assert [found.dim for found in listing[:len(sliced)]] == [t.dim for t in per_expert_tensors(layer) if t.routing]
        skipped = {id(t) for t in [*layer.experts.parameters(), *layer.experts.buffers()]}
        for attr in layer.family.shared_attrs:
            shared = getattr(layer.block, attr, None)
            if shared is not None:
                skipped |= {id(t) for t in [*shared.parameters(), *shared.buffers()]}
        others = sorted(name for name, t in [*layer.block.named_parameters(), *layer.block.named_buffers()]
                        if id(t) not in listed and id(t) not in skipped)
        unexplained = [name for name in others if name not in NOT_ROUTING
                       and not (layer.family.mlp_attr == "" and name.startswith(DECODER_LAYER_PARTS))]
        assert not unexplained, (family, unexplained)

        assert non_finite_routing_tensor(layer) is None, family  # a clean model is not refused
        for found, bad in zip(listing, [float("nan"), float("inf")] * len(listing)):
            tensor = found.tensor.data
            last = tensor.numel() - 1
            kept = tensor.view(-1)[last].clone()
            tensor.view(-1)[last] = bad
            where = list(torch.unravel_index(torch.tensor(last), tensor.shape))
            counts = "(1 NaN, 0 inf)" if math.isnan(bad) else "(0 NaN, 1 inf)"
            with pytest.raises(ValueError, match=rf"^here, MoE layer {layer.index} \({re.escape(layer.name)}\): "
                                                 rf"routing tensor {re.escape(found.name)} "
                                                 rf"{re.escape(str(list(tensor.shape)))} holds 1 NaN or inf value "
                                                 rf"{re.escape(counts)}, the first at index "
                                                 rf"{re.escape(str([int(i) for i in where]))}; what was not done\. "):
                check_routing_tensors(layer, "here", "what was not done")
            tensor.view(-1)[last] = kept
        checked[family] = names
    assert set(checked) == set(FAMILIES)
    # the kinds of routing tensor the families hold, besides router rows: correction biases (router or block), router
    # biases, per-expert scales, a router's norm scale, a per-expert output norm
    assert checked["deepseek_v3"][1:] == ["model.layers.2.mlp.gate.e_score_correction_bias"]
    assert checked["gpt_oss"][1:] == ["model.layers.1.mlp.router.bias"]
    assert checked["gemma4_text"] == ["model.layers.1.router.proj.weight", "model.layers.1.router.per_expert_scale",
                                      "model.layers.1.router.scale"]
    assert checked["minimax_m2"][1:] == ["model.layers.1.mlp.e_score_correction_bias"]
    assert checked["ernie4_5_moe"][1:] == ["model.layers.2.mlp.gate.moe_statics.e_score_correction_bias"]
    assert checked["ergo"][1:] == ["model.layers.2.mlp.gate.e_score_correction_bias",
                                   "model.layers.2.mlp.experts.post_expert_norm.weight"]


def test_a_tensor_not_in_memory_is_skipped(tiny) -> None:
    """A tensor without values here (the meta device: a streamed layer not read in) is skipped, not refused."""
    model = tiny("deepseek_v3")
    layer = find_moe_layers(model)[-1]
    bias = layer.router.e_score_correction_bias
    bias.data[0] = float("nan")
    layer.router._buffers["e_score_correction_bias"] = torch.empty(bias.shape, device="meta")
    assert non_finite_routing_tensor(layer) is None
    layer.router._buffers["e_score_correction_bias"] = bias
    assert non_finite_routing_tensor(layer).name == f"{layer.name}.gate.e_score_correction_bias"

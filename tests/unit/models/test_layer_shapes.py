"""Where a model is first examined (``lp.find_moe_layers``): a layer without experts, a top-k outside 1..experts
or a zero-size expert tensor is refused in one line naming the layer, the tensor and the config field; experts that
transformers' default ``grouped_mm`` cannot run (float64, rows not a multiple of 16 bytes) run its ``eager`` ones."""

from __future__ import annotations

import copy
import re

import pytest
import torch

import lightprune as lp
from lightprune.export.verify import default_probe, model_logits
from lightprune.models.experts_kernel import grouped_mm_runs

#: (family, config overrides, the refusal, whole)
REFUSED = {
    "moe_intermediate_size 0": ("qwen3_moe", dict(moe_intermediate_size=0),
                                "Qwen3MoeForCausalLM cannot be pruned: layer 0: zero-size expert tensor "
                                "model.layers.0.mlp.experts.gate_up_proj [8, 0, 32] (config moe_intermediate_size: 0) "
                                "and 1 more tensor, and 2 more layers; a MoE layer needs routed experts, 1 <= top_k <= "
                                "its experts and no zero-size expert tensor; fix its config"),
    "intermediate_size 0": ("mixtral", dict(intermediate_size=0),
                            "MixtralForCausalLM cannot be pruned: layer 0: zero-size expert tensor "
                            "model.layers.0.mlp.experts.gate_up_proj [8, 0, 32] (config intermediate_size: 0) and 1 "
                            "more tensor, and 1 more layer; "),
    "top_k 0": ("qwen3_moe", dict(num_experts_per_tok=0),
                "Qwen3MoeForCausalLM cannot be pruned: layer 0: top_k 0 of 8 experts (config num_experts_per_tok: 0), "
                "and 2 more layers; "),
    "top_k above the experts": ("mixtral", dict(num_experts_per_tok=9),
                                "MixtralForCausalLM cannot be pruned: layer 0: top_k 9 of 8 experts "
                                "(config num_experts_per_tok: 9), and 1 more layer; "),
    "no experts": ("qwen3_moe", dict(num_experts=0),
                   "Qwen3MoeForCausalLM has no MoE layers (config num_experts: 0): nothing to prune"),
    "deepseek no experts": ("deepseek_v3", dict(n_routed_experts=0),  # it builds MoE blocks of 0 experts
                            "DeepseekV3ForCausalLM cannot be pruned: layer 1: 0 routed experts "
                            "(config n_routed_experts: 0), and 1 more layer; "),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_an_unprunable_layer_is_refused_naming_the_config_field(tiny, case) -> None:
    family, overrides, message = REFUSED[case]
    model = tiny(family, **overrides)
    for call in (lp.find_moe_layers, lambda m: lp.score_weights(m, "aimer"),
                 lambda m: lp.collect_expert_stats(m, [default_probe(m)], criteria=["frequency"], progress=False)):
        with pytest.raises(ValueError) as err:
            call(model)
        assert str(err.value).startswith(message), str(err.value)
        assert "\n" not in str(err.value)


def test_grouped_mm_runs_what_torchs_kernel_takes(tiny) -> None:
    experts = lp.find_moe_layers(tiny("qwen3_moe"))[0].experts  # gate_up_proj [8, 32, 32], down_proj [8, 32, 16]
    assert grouped_mm_runs(experts)
    assert not grouped_mm_runs(copy.deepcopy(experts).to(torch.float64))
    assert grouped_mm_runs(copy.deepcopy(experts).to(torch.bfloat16))  # 16 bf16 values: 32 bytes
    narrow = lp.find_moe_layers(tiny("qwen3_moe", moe_intermediate_size=12))[0].experts
    assert grouped_mm_runs(narrow)  # 12 fp32 values: 48 bytes
    assert not grouped_mm_runs(copy.deepcopy(narrow).to(torch.bfloat16))  # 24 bytes


@pytest.mark.parametrize("dtype, width", [(torch.float64, 16), (torch.bfloat16, 12), (torch.float16, 12)])
def test_experts_grouped_mm_cannot_run_switch_to_eager_and_prune_exactly(tiny, dtype, width) -> None:
    model = tiny("qwen3_moe", moe_intermediate_size=width).to(dtype)
    probe = default_probe(model)
    config = model.config
    assert config._experts_implementation == "grouped_mm"
    with pytest.raises(RuntimeError, match="Float32, BFloat16 or Float16|strides should be multiple of 16 bytes"):
        model_logits(model, probe)  # transformers' own forward, before lightprune examined the model
    plan = lp.select_experts(lp.score_weights(model, "aimer"), ratio=0.5)
    assert config._experts_implementation == "eager"
    with lp.mask_experts(model, plan):
        masked = model_logits(model, probe)
    pruned = lp.prune_experts(copy.deepcopy(model), plan)
    assert torch.equal(model_logits(pruned, probe), masked) and torch.isfinite(masked).all()


@pytest.mark.parametrize("implementation", ["batched_mm", "grouped_mm"])
def test_an_implementation_that_runs_is_left_as_it_is(tiny, implementation) -> None:
    model = tiny("qwen3_moe")
    if implementation == "batched_mm":
        model = model.to(torch.float64)
    model.set_experts_implementation(implementation)
    lp.find_moe_layers(model)
    assert model.config._experts_implementation == implementation


def test_the_refusal_is_one_line_naming_the_field_in_every_layer_phrase(tiny) -> None:
    model = tiny("qwen3_moe", moe_intermediate_size=0)
    with pytest.raises(ValueError) as err:
        lp.prune_experts(model, lp.ExpertPlan(keep={0: [0, 1]}, num_experts={0: 8}))
    assert re.search(r"layer 0: zero-size expert tensor \S+ \[8, 0, 32\] \(config moe_intermediate_size: 0\)",
                     str(err.value))

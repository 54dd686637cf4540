"""M-SMoE's neuron alignment on real transformers 5 fused experts (Mixtral: gated, Aria: gated and transposed,
Nemotron-H: ungated relu^2) and on stand-ins with biases; GPT-OSS's interleaved gate is refused."""

from __future__ import annotations

import copy
import re
import types

import pytest
import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.integrations.moe import use_experts_implementation

from lightprune.experts.merging.align import has_standard_layout, neuron_features, neuron_permutation, permuted_expert
from lightprune.models import find_moe_layers
from lightprune.observe.experts_impl import run_expert

#: real families: (tiny family, overrides, is_transposed, has_gate)
FAMILIES = {
    "mixtral": ({}, False, True),
    "aria_text": ({}, True, True),
    "nemotron_h": ({"moe_intermediate_size": 8}, False, False),
}


def _stand_in(transposed: bool, gated: bool, experts: int = 4, hidden: int = 6, inter: int = 5,
              seed: int = 0) -> nn.Module:
    """A fused experts module with biases (no standard-gated family has them), built by transformers' decorator."""

    @use_experts_implementation(is_transposed=transposed, has_bias=True, has_gate=gated)
    class BiasedExperts(nn.Module):
        def __init__(self, config):
            super().__init__()
            gen = torch.Generator().manual_seed(seed)
            width = 2 * inter if gated else inter
            first = (experts, hidden, width) if transposed else (experts, width, hidden)
            down = (experts, inter, hidden) if transposed else (experts, hidden, inter)
            setattr(self, "gate_up_proj" if gated else "up_proj", nn.Parameter(torch.randn(first, generator=gen)))
            setattr(self, "gate_up_proj_bias" if gated else "up_proj_bias",
                    nn.Parameter(torch.randn(experts, width, generator=gen)))
            self.down_proj = nn.Parameter(torch.randn(down, generator=gen))
            self.down_proj_bias = nn.Parameter(torch.randn(experts, hidden, generator=gen))
            self.num_experts = experts
            self.act_fn = ACT2FN["silu"] if gated else ACT2FN["relu2"]

        def forward(self, hidden_states, top_k_index, top_k_weights):  # not used: run_expert runs one expert
            raise NotImplementedError

    return BiasedExperts(types.SimpleNamespace())


STAND_INS = {f"stand_in-{'T' if t else 'N'}-{'gated' if g else 'ungated'}": (t, g)
             for t in (False, True) for g in (True, False)}
CASES = [*FAMILIES, *STAND_INS]


@pytest.fixture
def make(tiny):
    def build(case: str) -> nn.Module:
        if case in STAND_INS:
            return _stand_in(*STAND_INS[case])
        overrides, transposed, gated = FAMILIES[case]
        experts = find_moe_layers(tiny(case, **overrides))[0].experts
        assert experts.is_transposed is transposed and experts.has_gate is gated and not experts.has_bias
        return experts
    return build


def _names(experts: nn.Module) -> list[str]:
    names = ["gate_up_proj" if experts.has_gate else "up_proj", "down_proj"]
    if experts.has_bias:
        names += ["gate_up_proj_bias" if experts.has_gate else "up_proj_bias", "down_proj_bias"]
    return names


def _intermediate(experts: nn.Module) -> int:
    return experts.down_proj.shape[1 if experts.is_transposed else 2]


def _write(experts: nn.Module, index: int, tensors: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, value in tensors.items():
            getattr(experts, name)[index].copy_(value)


@pytest.mark.parametrize("case", CASES)
def test_standard_layouts_are_recognised(make, case):
    experts = make(case)
    assert has_standard_layout(experts)
    hidden = experts.down_proj.shape[2 if experts.is_transposed else 1]
    rows = 2 if experts.has_gate else 1  # gate and up, or up only
    width = (rows + 1) * hidden + (rows if experts.has_bias else 0)  # the rows, the down column, their biases
    features = neuron_features(experts, 1)
    assert features.shape == (_intermediate(experts), width) and features.dtype == torch.float32


@pytest.mark.parametrize("case", CASES)
def test_permutation_recovers_a_hidden_reordering(make, case):
    experts = make(case)
    size = _intermediate(experts)
    gen = torch.Generator().manual_seed(11)
    hidden_perm = torch.randperm(size, generator=gen)
    assert not torch.equal(hidden_perm, torch.arange(size))
    shuffled = permuted_expert(experts, 0, hidden_perm)  # expert 1's neuron i := expert 0's neuron hidden_perm[i]
    _write(experts, 1, {k: v + 1e-4 * torch.randn(v.shape, generator=gen) for k, v in shuffled.items()})

    perm = neuron_permutation(experts, 0, 1)
    assert perm.dtype == torch.long
    assert torch.equal(perm, torch.argsort(hidden_perm))  # the inverse reordering, exactly
    aligned = permuted_expert(experts, 1, perm)
    assert sorted(aligned) == sorted(_names(experts))
    for name, value in aligned.items():
        torch.testing.assert_close(value, getattr(experts, name)[0].detach(), rtol=0, atol=1e-3)
    assert torch.equal(neuron_permutation(experts, 0, 0), torch.arange(size))


@pytest.mark.parametrize("case", CASES)
def test_permuting_an_expert_keeps_its_function(make, case):
    experts = make(case)
    size = _intermediate(experts)
    perm = torch.randperm(size, generator=torch.Generator().manual_seed(5))
    tensors = permuted_expert(experts, 2, perm)
    for name, value in tensors.items():
        original = getattr(experts, name)
        assert value.untyped_storage().data_ptr() != original.untyped_storage().data_ptr()  # a copy, not a view
        assert not value.requires_grad
        if name != "down_proj_bias":
            assert not torch.equal(value, original[2].detach())
    copied = copy.deepcopy(experts)
    _write(copied, 2, tensors)
    hidden = experts.down_proj.shape[2 if experts.is_transposed else 1]
    x = torch.randn(7, hidden, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        before, after = run_expert(experts, 2, x), run_expert(copied, 2, x)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-6)
    # the permuted weights as features: row i is the old row perm[i]
    torch.testing.assert_close(neuron_features(copied, 2), neuron_features(experts, 2)[perm], rtol=0, atol=0)


def test_transposed_layout_reads_the_same_features():
    plain = _stand_in(transposed=False, gated=True)
    flipped = _stand_in(transposed=True, gated=True)
    with torch.no_grad():
        flipped.gate_up_proj.copy_(plain.gate_up_proj.transpose(1, 2))
        flipped.down_proj.copy_(plain.down_proj.transpose(1, 2))
        flipped.gate_up_proj_bias.copy_(plain.gate_up_proj_bias)
        flipped.down_proj_bias.copy_(plain.down_proj_bias)
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(run_expert(flipped, 1, x), run_expert(plain, 1, x))
    torch.testing.assert_close(neuron_features(flipped, 1), neuron_features(plain, 1), rtol=0, atol=0)
    # neuron 3 of expert 1: gate row 3, up row 5 + 3, down column 3, gate bias 3, up bias 8
    expected = torch.cat([plain.gate_up_proj[1, 3], plain.gate_up_proj[1, 8], plain.down_proj[1, :, 3],
                          plain.gate_up_proj_bias[1, [3, 8]]]).detach()
    torch.testing.assert_close(neuron_features(plain, 1)[3], expected, rtol=0, atol=0)


def test_gpt_oss_interleaved_gate_is_refused(tiny):
    experts = find_moe_layers(tiny("gpt_oss"))[0].experts
    assert type(experts).__name__ == "GptOssExperts" and experts.is_transposed and experts.has_bias
    assert not has_standard_layout(experts)
    with pytest.raises(ValueError, match="GptOssExperts"):
        neuron_features(experts, 0)
    with pytest.raises(ValueError, match="GptOssExperts"):
        neuron_permutation(experts, 0, 1)
    with pytest.raises(ValueError, match="GptOssExperts"):
        permuted_expert(experts, 0, torch.arange(experts.intermediate_size))


def test_instance_level_gate_is_not_standard(make):
    experts = make("mixtral")
    experts._apply_gate = lambda gate_up: gate_up[..., ::2] * gate_up[..., 1::2]
    assert not has_standard_layout(experts)
    with pytest.raises(ValueError, match="MixtralExperts"):
        neuron_features(experts, 0)


def test_bad_permutations_and_ids_are_refused(make):
    experts = make("mixtral")
    size = _intermediate(experts)
    duplicated = torch.arange(size)
    duplicated[3] = 0
    with pytest.raises(ValueError, match=re.escape("repeated ids [0] and missing ids [3]")):
        permuted_expert(experts, 0, duplicated)
    with pytest.raises(ValueError, match=re.escape(f"range({size}), got shape ({size - 1},)")):
        permuted_expert(experts, 0, torch.arange(size - 1))
    with pytest.raises(ValueError, match=re.escape(f"got shape (1, {size})")):
        permuted_expert(experts, 0, torch.arange(size).unsqueeze(0))
    with pytest.raises(ValueError, match="torch.float32"):
        permuted_expert(experts, 0, torch.arange(size, dtype=torch.float32))
    with pytest.raises(ValueError, match=re.escape(f"outside it: [{size}]")):
        permuted_expert(experts, 0, torch.cat([torch.arange(1, size), torch.tensor([size])]))
    with pytest.raises(TypeError, match=re.escape("got [0, 1]")):
        permuted_expert(experts, 0, [0, 1])
    with pytest.raises(ValueError, match=re.escape("[0, 8), got 8")):
        neuron_features(experts, 8)
    with pytest.raises(TypeError, match="got True"):
        neuron_permutation(experts, True, 1)
    with pytest.raises(ValueError, match="got -1"):
        permuted_expert(experts, -1, torch.arange(size))


def test_default_gate_is_first_half_gate_second_half_up(make):
    # the layout align.py relies on: transformers' _default_apply_gate computes act(gate_up[:I]) * gate_up[I:]
    experts = make("mixtral")
    gate_up = torch.randn(3, 2 * _intermediate(experts), generator=torch.Generator().manual_seed(2))
    gate, up = gate_up.split(_intermediate(experts), dim=-1)
    torch.testing.assert_close(experts._apply_gate(gate_up), experts.act_fn(gate) * up, rtol=0, atol=0)

"""WidthPlan (the plan of MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), section
3), decoder-layer discovery for width pruning and token modality."""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures.width import dense_lm

from lightprune.core.errors import PlanError
from lightprune.width.layers import find_width_layers, vision_token_ids
from lightprune.width.modality import token_modality
from lightprune.width.paths import MODALITIES, PAD, PATHS, SYSTEM, TEXT, VISION
from lightprune.width.plan import WidthPlan


@pytest.fixture(scope="module")
def lm():
    return dense_lm()


def _random_plan(plan: WidthPlan, seed: int = 0) -> WidthPlan:
    gen = torch.Generator().manual_seed(seed)
    attn = {l: torch.rand(n, 3, generator=gen) < 0.5 for l, n in plan.num_heads.items()}
    ffn = {l: {mu: torch.rand(m, generator=gen) < 0.5 for mu in MODALITIES} for l, m in plan.intermediate_size.items()}
    return plan.replace(attn_keep=attn, ffn_keep=ffn)


def test_find_width_layers_dense_and_moe(lm, tiny):
    layers = find_width_layers(lm)
    assert [l.index for l in layers] == [0, 1]
    assert all((l.num_heads, l.num_kv_heads, l.head_dim, l.intermediate_size) == (4, 2, 8, 24) for l in layers)
    assert layers[0].down_proj is lm.model.layers[0].mlp.down_proj
    moe = tiny("qwen3_vl_moe")
    layers = find_width_layers(moe)
    assert [(l.index, l.down_proj, l.intermediate_size, l.num_heads, l.num_kv_heads) for l in layers] == \
        [(0, None, None, 4, 2), (1, None, None, 4, 2)]
    # the language model's attention, never the vision tower's
    assert layers[0].attention is moe.model.language_model.layers[0].self_attn


def test_find_width_layers_through_peft_and_lightning(lm):
    import lightning.pytorch as pl
    from peft import LoraConfig, get_peft_model

    class Holder(pl.LightningModule):
        def __init__(self, model):
            super().__init__()
            self.model = model

    wrapped = get_peft_model(copy.deepcopy(lm), LoraConfig(r=2, target_modules=["down_proj", "q_proj"]))
    for model in (wrapped, Holder(wrapped)):
        layers = find_width_layers(model)
        decoder = wrapped.get_base_model().model.layers
        assert [(l.attention, l.mlp, l.down_proj) for l in layers] == \
            [(d.self_attn, d.mlp, d.mlp.down_proj) for d in decoder]
        assert type(layers[0].down_proj).__module__.startswith("peft") and layers[0].intermediate_size == 24
        assert WidthPlan.dense(model) == WidthPlan.dense(lm)


def test_dense_plan_of_dense_lm_and_mllms(lm, tiny):
    for family in ("llava_onevision", "qwen2_5_vl"):
        mllm = tiny(family)
        plan = WidthPlan.dense(mllm)
        assert plan.num_heads == {0: 4, 1: 4} and plan.intermediate_size == {0: 24, 1: 24}
        assert find_width_layers(mllm)[1].mlp is mllm.model.language_model.layers[1].mlp
        plan.validate(mllm)
    plan = WidthPlan.dense(lm)
    assert plan.num_heads == {0: 4, 1: 4} and plan.intermediate_size == {0: 24, 1: 24}
    assert all(m.shape == (4, 3) and m.all() for m in plan.attn_keep.values())
    assert all(plan.ffn_keep[l][mu].shape == (24,) and plan.ffn_keep[l][mu].all() for l in (0, 1) for mu in MODALITIES)
    plan.validate(lm)
    moe = tiny("qwen3_vl_moe")
    plan = WidthPlan.dense(moe)
    assert plan.num_heads == {0: 4, 1: 4} and plan.intermediate_size == {} and plan.ffn_keep == {}
    plan.validate(moe)
    assert all(fraction == 0.0 for fraction in map(plan.pruned_fraction, PATHS + ("ffn_vision", "ffn_text")))


def test_json_round_trip(lm, tmp_path):
    plan = _random_plan(WidthPlan.dense(lm))
    plan.metadata["stage"] = "t2v"
    again = WidthPlan.load(plan.save(tmp_path / "w.json"))
    assert again == plan
    assert WidthPlan.from_dict(plan.to_dict()) == plan
    # bools are read as well as 0/1
    data = plan.to_dict()
    data["attn_keep"]["0"] = [[bool(v) for v in row] for row in data["attn_keep"]["0"]]
    assert WidthPlan.from_dict(data) == plan
    other = plan.replace(attn_keep={0: ~plan.attn_keep[0]})
    assert other != plan


def test_pruned_fraction(lm):
    plan = WidthPlan.dense(lm)
    keep0 = torch.ones(4, 3, dtype=torch.bool)
    keep0[:3, 0] = False  # 3 of 8 heads lose V2V
    keep0[1, 2] = False
    vis = torch.ones(24, dtype=torch.bool)
    vis[:12] = False
    plan = plan.replace(attn_keep={0: keep0}, ffn_keep={1: {"vision": vis}})
    assert plan.pruned_fraction("v2v") == 3 / 8
    assert plan.pruned_fraction("t2v") == 0.0
    assert plan.pruned_fraction("t2t") == 1 / 8
    assert plan.pruned_fraction("ffn_vision") == 12 / 48
    assert plan.pruned_fraction("ffn_text") == 0.0
    # replacing one modality keeps the other; layer 0's FFN stays dense
    assert plan.ffn_keep[1]["text"].all() and plan.ffn_keep[0]["vision"].all()
    with pytest.raises(ValueError, match="ffn_gate"):
        plan.pruned_fraction("ffn_gate")


def test_validate_names_layer_and_counts(lm, tiny):
    plan = WidthPlan.dense(lm)
    heads = WidthPlan({}, {}, {0: 4, 1: 8}, {0: 24, 1: 24})
    with pytest.raises(PlanError, match=r"layer 1 expects 8 attention heads, the model has 4"):
        heads.validate(lm)
    channels = WidthPlan({}, {}, {0: 4, 1: 4}, {0: 24, 1: 32})
    with pytest.raises(PlanError, match=r"layer 1 expects an FFN of 32 channels, the model has 24"):
        channels.validate(lm)
    layers = WidthPlan({}, {}, {0: 4, 1: 4, 2: 4}, {0: 24, 1: 24})
    with pytest.raises(PlanError, match=r"decoder layers \[0, 1, 2\].*layers \[0, 1\]"):
        layers.validate(lm)
    moe = tiny("qwen3_vl_moe")
    ffn_on_moe = WidthPlan({}, {1: {mu: torch.ones(24, dtype=torch.bool) for mu in MODALITIES}},
                           {0: 4, 1: 4}, {1: 24})
    with pytest.raises(PlanError, match=r"FFN channels of layer 1, an MoE layer"):
        ffn_on_moe.validate(moe)
    with pytest.raises(PlanError, match=r"layer 0 expects an FFN of None"):
        WidthPlan({}, {}, {0: 4, 1: 4}, {1: 24}).validate(lm)
    plan.validate(lm)


def test_construction_errors():
    with pytest.raises(PlanError, match=r"attn_keep\[0\] has shape \(4, 2\), expected \(4, 3\)"):
        WidthPlan({0: torch.ones(4, 2, dtype=torch.bool)}, {}, {0: 4}, {})
    with pytest.raises(PlanError, match=r"ffn_keep names layer 0, which has no dense FFN"):
        WidthPlan({}, {0: {"vision": [1] * 8, "text": [1] * 8}}, {0: 4}, {})
    with pytest.raises(PlanError, match=r"exactly the keys \['vision', 'text'\], got \['vision'\]"):
        WidthPlan({}, {0: {"vision": [1] * 8}}, {0: 4}, {0: 8})
    with pytest.raises(PlanError, match=r"booleans or 0/1"):
        WidthPlan({0: [[0, 1, 2]] * 4}, {}, {0: 4}, {})
    with pytest.raises(PlanError, match=r"attn_keep names layer 3"):
        WidthPlan({3: torch.ones(4, 3, dtype=torch.bool)}, {}, {0: 4}, {})
    with pytest.raises(PlanError, match=r"unknown width plan keys \['heads'\]"):
        WidthPlan.from_dict({"heads": {}, "attn_keep": {}, "ffn_keep": {}, "num_heads": {}, "intermediate_size": {}})



def test_a_nan_or_infinity_anywhere_is_refused_in_one_line_naming_its_key():
    """The expert plans' message (experts.plan_base.check_finite), "width plan" as the kind."""
    said = ": a width plan holds finite numbers only (JSON has no NaN or Infinity; write null or a number)"
    with pytest.raises(PlanError) as raised:
        WidthPlan({}, {}, {0: 4}, {}, metadata={"scores": [1.0, float("-inf")]})
    assert str(raised.value) == "metadata['scores'][1] is -Infinity" + said
    data = {"attn_keep": {}, "ffn_keep": {}, "num_heads": {"0": 4}, "intermediate_size": {"0": float("nan")}}
    with pytest.raises(PlanError) as raised:
        WidthPlan.from_dict(data)
    assert str(raised.value) == "intermediate_size['0'] is NaN" + said

def test_vision_token_ids(lm, tiny):
    assert vision_token_ids(tiny("qwen3_vl_moe")) == {120, 121}
    assert vision_token_ids(lm) == {120}
    with pytest.raises(ValueError, match=r"Qwen2ForCausalLM \(model_type 'qwen2'\) has no image_token_id"):
        vision_token_ids(dense_lm(image_token_id=None))


def test_token_modality_hand_built():
    S, V, T, P = SYSTEM, VISION, TEXT, PAD
    ids = torch.tensor([
        [5, 6, 9, 9, 9, 7, 8, 0, 0],   # system prefix, vision span, text, right padding
        [0, 0, 5, 9, 9, 7, 9, 8, 8],   # left padding, vision after one system token, a second vision span
        [9, 9, 7, 8, 8, 8, 8, 8, 8],   # vision first: no system token
        [5, 6, 7, 8, 0, 0, 0, 0, 0],   # text only
        [0, 5, 9, 7, 8, 0, 0, 0, 0]])  # padding on both sides
    mask = torch.tensor([
        [1, 1, 1, 1, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 0, 0, 0, 0, 0],
        [0, 1, 1, 1, 1, 0, 0, 0, 0]])
    expected = torch.tensor([
        [S, S, V, V, V, T, T, P, P],
        [P, P, S, V, V, T, V, T, T],
        [V, V, T, T, T, T, T, T, T],
        [T, T, T, T, P, P, P, P, P],
        [P, S, V, T, T, P, P, P, P]], dtype=torch.int8)
    got = token_modality(ids, mask, {9})
    assert got.dtype == torch.int8 and torch.equal(got, expected)
    # a vision id under padding is padding
    ids[0, 8] = 9
    assert torch.equal(token_modality(ids, mask, {9}), expected)
    with pytest.raises(ValueError, match="must match input_ids"):
        token_modality(ids, mask[:, :4], {9})

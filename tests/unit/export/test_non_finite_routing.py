"""``prune_checkpoint`` refuses a NaN or inf in a tensor the routing reads, as stored, before it writes anything: the
refusal ``prune_experts`` gives on the loaded model, word for word but for the entry point's name; the stored routing
tensors are read in alone (``Skeleton.resident_tensors``) and released after."""

from __future__ import annotations

import math

import pytest
import torch
from fixtures import scores_for_layers

import lightprune as lp
from lightprune.checkpoints.reader import Checkpoint
from lightprune.checkpoints.skeleton import Skeleton

#: (family, tensor inside the last MoE block): a correction bias (router buffer), a router bias, a per-expert scale,
#: a router norm's scale, a block's correction bias, a per-expert output norm
CASES = [
    ("deepseek_v3", "gate.e_score_correction_bias"),
    ("gpt_oss", "router.bias"),
    ("gemma4_text", "router.per_expert_scale"),
    ("gemma4_text", "router.scale"),
    ("minimax_m2", "e_score_correction_bias"),
    ("ergo", "experts.post_expert_norm.weight"),
]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("family,inside", CASES)
def test_prune_checkpoint_refuses_what_prune_experts_refuses_before_writing(tiny, tmp_path, family, inside,
                                                                             bad) -> None:
    model = tiny(family)
    layer = lp.find_moe_layers(model)[-1]
    name = f"{layer.name}.{inside}"
    owner, _, attr = name.rpartition(".")
    getattr(model.get_submodule(owner), attr).data.view(-1)[0] = bad
    model.save_pretrained(tmp_path / "ckpt")
    plan = lp.select_experts(scores_for_layers(lp.find_moe_layers(model)), 0.25)
    with pytest.raises(ValueError) as streamed:
        lp.prune_checkpoint(tmp_path / "ckpt", plan, tmp_path / "out", progress=False)
    with pytest.raises(ValueError) as in_memory:
        lp.prune_experts(model, plan)
    message = str(streamed.value)
    assert message.startswith(f"prune_checkpoint, MoE layer {layer.index} ({layer.name}): routing tensor {name} ")
    assert ("(1 NaN, 0 inf)" if math.isnan(bad) else "(0 NaN, 1 inf)") in message
    assert "nothing was pruned or written" in message
    assert message.replace("prune_checkpoint, ", "prune_experts, ", 1) == str(in_memory.value)
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no staging directory left either


def test_resident_tensors_reads_in_only_the_named_tensors_and_releases_them(tiny, tmp_path) -> None:
    model = tiny("minimax_m2")
    model.save_pretrained(tmp_path / "ckpt")
    layer = lp.find_moe_layers(model)[-1]
    names = [found.name for found in layer.family.routing_tensors(layer)]
    with Checkpoint(tmp_path / "ckpt") as checkpoint:
        skeleton = Skeleton(checkpoint)
        state = skeleton.model.state_dict(keep_vars=True)
        with skeleton.resident_tensors(*names):
            inside = {n for n, t in skeleton.model.state_dict(keep_vars=True).items() if t.device.type != "meta"}
            assert inside == set(names)
            for name in names:
                assert torch.equal(skeleton.model.state_dict()[name], model.state_dict()[name])
        assert all(t.device.type == "meta" for t in skeleton.model.state_dict(keep_vars=True).values())
        assert skeleton.model.state_dict(keep_vars=True).keys() == state.keys()
        with pytest.raises(ValueError, match=r"\['model\.layers\.0\.mlp\.gate\.nothing'\] are not tensors of "), \
                skeleton.resident_tensors("model.layers.0.mlp.gate.nothing"):
            pass

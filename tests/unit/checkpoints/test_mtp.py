"""Multi-token-prediction layers pruned with their model (DeepSeek-V3's ``model.layers.61``, Qwen3-Next's
``mtp.layers.0``), in float and FP8: the written MTP layer always holds as many experts and router rows as the
config says, chosen by the plan or by AIMER on its own weights; the model's logits are the masked source's."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import lightprune as lp
from tests.fixtures.shipped import write_deepseek_with_mtp, write_qwen3_next_with_mtp

BLOCK = (8, 8)


@pytest.fixture(scope="module")
def fp8_with_mtp(tmp_path_factory):
    """A DeepSeek-V3 with its MTP layer 3, FP8 in 8x8 blocks."""
    root = tmp_path_factory.mktemp("mtp")
    return lp.quantize_checkpoint(write_deepseek_with_mtp(root / "float"), root / "fp8", block=BLOCK, progress=False)


@pytest.mark.parametrize("quantized", [False, True], ids=["bf16", "fp8"])
@pytest.mark.exhaustive
def test_deepseek_v3s_mtp_layer_61_agrees_with_its_config(tmp_path, quantized):
    """61 layers and the MTP layer 61 in a second shard, as DeepSeek-V3 ships: a calibration plan names layers 1-60
    only; the written layer 61 holds as many experts and router rows as the config says, chosen by its own weights."""
    source = write_deepseek_with_mtp(tmp_path / "src", layers=61, hidden_size=16, intermediate_size=16,
                                     moe_intermediate_size=8, q_lora_rank=8, kv_lora_rank=8)
    if quantized:
        source = lp.quantize_checkpoint(source, tmp_path / "fp8", block=BLOCK, progress=False)
    gen = torch.Generator().manual_seed(5)
    # two of each group of 4 (its routing: 2 groups, 1 chosen per token)
    keep = {i: sorted([*torch.randperm(4, generator=gen)[:2].tolist(),
                       *(4 + torch.randperm(4, generator=gen)[:2]).tolist()]) for i in range(1, 61)}
    plan = lp.ExpertPlan(keep=keep, num_experts={i: 8 for i in keep})
    lp.prune_checkpoint(source, plan, tmp_path / "out", progress=False)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["num_hidden_layers"] == 61 and config["n_routed_experts"] == 4
    with safe_open(tmp_path / "out" / "model-00002-of-00002.safetensors", "pt") as f:
        names = list(f.keys())
        assert f.get_slice("model.layers.61.mlp.gate.weight").get_shape()[0] == 4
        assert f.get_slice("model.layers.61.mlp.gate.e_score_correction_bias").get_shape() == [4]
    assert {int(k.split(".")[5]) for k in names if ".mlp.experts." in k} == {0, 1, 2, 3}
    manifest = json.loads((tmp_path / "out" / "lightprune_export.json").read_text())
    chosen = manifest["mtp_layers"]["61"]
    assert chosen["chosen_by"].startswith("aimer")
    ranked = lp.score_weights(source, "aimer", progress=False)  # AIMER of layer 61's own experts
    assert chosen["kept"] == lp.select_experts({61: ranked[61]}, None, n_per_layer=4,
                                               limits={61: ranked.limits[61]}).keep[61]
    assert sorted(manifest["plan"]["keep"], key=int) == [str(i) for i in range(1, 61)]


def test_qwen3_nexts_mtp_module_is_pruned_as_decoder_layer_num_hidden_layers(tmp_path):
    """Qwen3-Next stores its MTP layer as ``mtp.layers.0`` (beside ``mtp.fc`` and its norms): read as decoder layer 3
    of a 3-layer model, scored from its own weights, pruned to the config's count; the model's logits are the masked
    source's."""
    source = write_qwen3_next_with_mtp(tmp_path / "src")
    scores = lp.score_weights(source, "aimer", progress=False)
    assert 3 in scores  # the MTP layer, scored from its own weights
    model = lp.load_pruned(source)
    layers = [layer.index for layer in lp.find_moe_layers(model)]
    plan = lp.select_experts({i: scores[i] for i in layers}, 0.5, limits={i: scores.limits[i] for i in layers})
    lp.prune_checkpoint(source, plan, tmp_path / "out", progress=False)
    after = load_file(tmp_path / "out" / "model.safetensors")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["num_hidden_layers"] == 3 and config["mtp_num_hidden_layers"] == 1
    assert after["mtp.layers.0.mlp.gate.weight"].shape[0] == config["num_experts"] == 4
    assert {int(k.split(".")[5]) for k in after if k.startswith("mtp.layers.0.mlp.experts.")} == {0, 1, 2, 3}
    assert "mtp.fc.weight" in after and "model.layers.3.mlp.gate.weight" not in after
    manifest = json.loads((tmp_path / "out" / "lightprune_export.json").read_text())
    assert manifest["mtp_layers"]["3"]["kept"] == lp.select_experts(
        {3: scores[3]}, None, n_per_layer=4, limits={3: scores.limits[3]}).keep[3]
    ids = torch.randint(0, 100, (2, 10), generator=torch.Generator().manual_seed(6))
    with torch.no_grad(), lp.mask_experts(model, plan):
        masked = model(ids).logits
    with torch.no_grad():
        assert torch.equal(lp.load_pruned(tmp_path / "out")(ids).logits, masked)


def test_a_plan_keeping_another_count_in_the_mtp_layer_is_refused(fp8_with_mtp, tmp_path):
    fp8_dir = fp8_with_mtp
    plan = lp.ExpertPlan(keep={1: [0, 1, 4, 5], 2: [0, 1, 4, 5], 3: [0, 1, 2, 4, 5, 6]}, num_experts={1: 8, 2: 8, 3: 8})
    with pytest.raises(lp.PlanError, match="multi-token-prediction layer 3, the written config names 4"):
        lp.prune_checkpoint(fp8_dir, plan, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_a_plan_naming_the_mtp_layer_is_refused_by_an_in_memory_export_saying_where_it_is_pruned(fp8_with_mtp,
                                                                                                tmp_path):
    plan = lp.select_experts(lp.score_weights(fp8_with_mtp, "aimer", progress=False), 0.5)  # names layer 3
    model = lp.load_pruned(fp8_with_mtp)
    said = (r"plan names layer\(s\) \[3\], the checkpoint's multi-token-prediction layer\(s\), which the model in "
            r"memory does not hold: .*lp.prune_checkpoint")
    with pytest.raises(lp.PlanError, match=said):
        lp.export_pruned(model, plan, tmp_path / "out")
    assert not (tmp_path / "out").exists()

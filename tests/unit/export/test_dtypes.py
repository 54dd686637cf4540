"""float64, float16 and bfloat16 checkpoints through every path, exactly: streamed scores and calibration equal the
in-memory ones, the pruned model's logits equal the masked model's, the saved export reloads to the pruned model's
tensors and logits, and the checkpoint pruned shard by shard holds the same tensors.

Each checkpoint is a tiny model saved in the dtype and loaded back as a user loads one (``from_pretrained`` with the
checkpoint's dtype, through ``lp.load_pruned``): transformers' default ``grouped_mm`` experts have no float64 kernel,
so its experts run transformers' ``eager`` implementation (``lightprune.models.experts_kernel``).
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

import lightprune as lp
from lightprune.export import MANIFEST_FILE
from lightprune.export.verify import default_probe, model_logits
from lightprune.models.tiny import tiny_model
from lightprune.models.tiny_batches import tiny_text_batch

#: Ergo keeps its embeddings, norms and router in float32 in a model of another dtype
CASES = [(family, dtype) for family in ("qwen3_moe", "deepseek_v3", "ergo")
         for dtype in (torch.float64, torch.float16, torch.bfloat16)]
EXPERTS = (".gate_up_proj", ".up_proj", ".down_proj")


def _id(case) -> str:
    return f"{case[0]}-{str(case[1]).removeprefix('torch.')}"


@pytest.fixture(scope="module", params=CASES, ids=_id)
def checkpoint(request, tmp_path_factory):
    """(family, dtype, checkpoint dir, the model loaded from it, a plan, the plan's pruned copy of the model)."""
    family, dtype = request.param
    path = tmp_path_factory.mktemp(_id(request.param)) / "src"
    tiny_model(family, seed=2).to(dtype).save_pretrained(path)
    model = lp.load_pruned(path)
    plan = lp.select_experts(lp.score_weights(model, "aimer"), ratio=0.5)
    return family, dtype, path, model, plan, lp.prune_experts(copy.deepcopy(model), plan)


def test_the_loaded_model_keeps_the_checkpoints_dtype_and_runs(checkpoint) -> None:
    _, dtype, _, model, _, _ = checkpoint
    assert {p.dtype for name, p in model.named_parameters() if name.endswith(EXPERTS)} == {dtype}
    impl = model.config.get_text_config()._experts_implementation
    assert impl == ("eager" if dtype == torch.float64 else "grouped_mm")
    assert torch.isfinite(model_logits(model, default_probe(model))).all()


def test_streamed_weight_scores_equal_the_in_memory_ones(checkpoint) -> None:
    _, _, path, model, _, _ = checkpoint
    for criterion in ("aimer", "magnitude", "router_norm"):
        want, got = lp.score_weights(model, criterion), lp.score_weights(path, criterion, progress=False)
        assert got.keys() == want.keys()
        assert all(torch.equal(got.raw[i], want.raw[i]) for i in want), criterion


def test_streamed_calibration_equals_the_in_memory_one(checkpoint) -> None:
    _, _, path, model, _, _ = checkpoint
    batches = [tiny_text_batch(model, batch_size=2, seq_len=8, seed=s, pad=s == 1) for s in range(2)]
    kwargs = dict(criteria=["frequency", "reap", "ean", "delta_h"], progress=False)
    want = lp.collect_expert_stats(model, batches, **kwargs)
    got = lp.collect_expert_stats(path, batches, batches_per_pass=1, **kwargs)
    assert got.tokens == want.tokens and got.samples == want.samples
    for criterion in kwargs["criteria"]:
        have, expected = got.raw(criterion, "all"), want.raw(criterion, "all")
        assert have.keys() == expected.keys()
        assert all(torch.equal(have[i], expected[i]) for i in expected), criterion
        assert all(torch.isfinite(expected[i]).all() for i in expected), criterion


def test_the_pruned_models_logits_equal_the_masked_models(checkpoint) -> None:
    _, dtype, _, model, plan, pruned = checkpoint
    probe = default_probe(model)
    with lp.mask_experts(model, plan):
        masked = model_logits(model, probe)
    assert torch.equal(model_logits(pruned, probe), masked)
    assert {p.dtype for name, p in pruned.named_parameters() if name.endswith(EXPERTS)} == {dtype}


def test_the_saved_export_reloads_to_the_pruned_model(checkpoint, tmp_path) -> None:
    _, dtype, _, _, plan, pruned = checkpoint
    pruned = copy.deepcopy(pruned)
    result = lp.save_pruned(pruned, tmp_path / "out")
    manifest = json.loads((tmp_path / "out" / MANIFEST_FILE).read_text())
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert manifest["dtype"] == config["dtype"] == str(dtype).removeprefix("torch.")
    assert manifest["verification"]["max_abs_diff"] <= manifest["verification"]["tolerance"]
    reloaded = lp.load_pruned(result)
    want, got = pruned.state_dict(), reloaded.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert torch.equal(model_logits(reloaded, default_probe(reloaded)), model_logits(pruned, default_probe(pruned)))


def test_the_checkpoint_pruned_shard_by_shard_equals_the_pruned_model(checkpoint, tmp_path) -> None:
    _, _, path, _, plan, pruned = checkpoint
    out = lp.prune_checkpoint(path, plan, tmp_path / "out", progress=False)
    assert out.verification["logits"]["max_abs_diff"] <= out.verification["logits"]["tolerance"]
    assert set(out.verification["blocks"]) == {str(i) for i in plan.keep}
    reloaded = lp.load_pruned(out)
    want, got = pruned.state_dict(), reloaded.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)

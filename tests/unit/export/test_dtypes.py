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
from lightprune.testing.batches import tiny_text_batch
from lightprune.testing.tiny import tiny_model

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


# ----------------------------------------------------------------------------------- dtypes lightprune does not compute in
_CAST = ("holds all {n} of its parameters in {dtype}: lightprune computes in float32, bfloat16, float16 or float64; "
         "cast the model to one of them first (model.to(torch.bfloat16))")


def _entry_points(model, plan, out):
    """Every in-memory entry point, called on ``model``: {name: call}."""
    batch = [{"input_ids": torch.ones(1, 4, dtype=torch.long)}]
    return {"score_weights": lambda: lp.score_weights(model, "aimer"),
            "collect_expert_stats": lambda: lp.collect_expert_stats(model, batch, progress=False),
            "prune_experts": lambda: lp.prune_experts(model, plan),
            "export_pruned": lambda: lp.export_pruned(model, plan, out),
            "save_pruned": lambda: lp.save_pruned(model, out)}


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.complex64],
                         ids=lambda d: str(d).removeprefix("torch."))
def test_a_model_cast_to_a_dtype_lightprune_does_not_compute_in_is_refused_up_front(tiny, tmp_path, dtype) -> None:
    """Each in-memory entry point refuses it in one line naming the dtype and what to do, before any work: nothing is
    written, the model's tensors are as they were (torch alone says '"neg_cpu" not implemented for
    'Float8_e4m3fn'' from inside scoring)."""
    source = tiny("qwen3_moe", seed=3)
    plan = lp.select_experts(lp.score_weights(source, "aimer"), ratio=0.5)
    model = source.to(dtype)
    count = len(list(model.parameters()))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for name, call in _entry_points(model, plan, tmp_path / "out").items():
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == "Qwen3MoeForCausalLM " + _CAST.format(
            n=count, dtype=str(dtype).removeprefix("torch.")), name
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*")), name
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k].view(torch.uint8), before[k].view(torch.uint8)) for k in before)


def test_one_parameter_in_float8_is_named(tiny) -> None:
    model = tiny("qwen3_moe", seed=3)
    gate = model.model.layers[1].mlp.gate
    gate.weight = torch.nn.Parameter(gate.weight.data.to(torch.float8_e4m3fn), requires_grad=False)
    with pytest.raises(ValueError) as err:
        lp.score_weights(model, "aimer")
    assert str(err.value) == ("Qwen3MoeForCausalLM holds 1 parameter (model.layers.1.mlp.gate.weight) in "
                              "float8_e4m3fn: lightprune computes in float32, bfloat16, float16 or float64; cast the "
                              "model to one of them first (model.to(torch.bfloat16))")


def test_integer_expert_weights_are_refused_and_integers_elsewhere_are_left_alone(tiny) -> None:
    """Routed experts holding int8 weights (a quantized model's) would be scored as numbers they are not; an integer
    parameter outside the experts (a 4-bit fine-tuning's packed projection) is no concern of the check."""
    model = tiny("qwen3_moe", seed=3)
    want = lp.score_weights(model, "aimer")
    attention = model.model.layers[0].self_attn.o_proj
    attention.weight = torch.nn.Parameter(torch.zeros(attention.weight.shape, dtype=torch.uint8), requires_grad=False)
    got = lp.score_weights(model, "aimer")  # aimer reads the experts only
    assert all(torch.equal(got.raw[i], want.raw[i]) for i in want.raw)
    experts = model.model.layers[2].mlp.experts
    experts.down_proj = torch.nn.Parameter(experts.down_proj.data.to(torch.int8), requires_grad=False)
    with pytest.raises(ValueError) as err:
        lp.score_weights(model, "aimer")
    assert str(err.value) == ("Qwen3MoeForCausalLM's routed experts hold 1 parameter in int8 "
                              "(model.layers.2.mlp.experts.down_proj): lightprune scores and prunes experts whose "
                              "weights are float32, bfloat16, float16 or float64; load the model unquantized")


def test_a_checkpoint_stored_in_float8_is_refused_alike_by_every_path(tiny, tmp_path) -> None:
    """The streamed paths would build the model in the weights' dtype (torch: "couldn't find storage object
    Float8_e4m3fnStorage"); every path refuses it naming the checkpoint, the dtype and its share of the bytes."""
    from safetensors.torch import load_file, save_file

    model = tiny("qwen3_moe", seed=3)
    path = tmp_path / "ckpt"
    model.save_pretrained(path)
    tensors = {k: v.to(torch.float8_e4m3fn) for k, v in load_file(path / "model.safetensors").items()}
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    plan = lp.select_experts(lp.score_weights(model, "aimer"), ratio=0.5)
    expected = (f"checkpoint {str(path)!r}: its weights are stored in float8_e4m3fn (100% of the floating tensor "
                "bytes), which lightprune does not compute in (it computes in float32, bfloat16, float16 or float64); "
                "re-save the checkpoint in one of them")
    for call in (lambda: lp.load_pruned(path), lambda: lp.score_weights(path, "aimer", progress=False),
                 lambda: lp.prune_checkpoint(path, plan, tmp_path / "out", progress=False),
                 lambda: lp.collect_expert_stats(path, [{"input_ids": torch.ones(1, 4, dtype=torch.long)}],
                                                 progress=False)):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == expected
    assert not (tmp_path / "out").exists()

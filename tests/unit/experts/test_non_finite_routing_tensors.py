"""A NaN or inf in a tensor the routing reads (router rows and biases, correction biases on the router or the block,
per-expert scales, a router's norm, a per-expert output norm) is refused by every entry point that observes or
slices the routing, naming the layer, the tensor, the non-finite count and the first index: calibration in memory and
streamed from a checkpoint (the same message, "before batch 0"), weight scoring in memory and from a checkpoint (the
same message), ``prune_experts`` (the model left as it was) and ``mask_experts`` (no router replaced). Calibration
checks them once per layer and pass, not per batch. (``prune_checkpoint``: tests/unit/export.)"""

from __future__ import annotations

import pytest
import torch
from fixtures import padded_batch, scores_for_layers

import lightprune as lp
from lightprune.experts.calibration import ExpertObserver
from lightprune.experts.mask import is_masked

#: (family, tensor inside the last MoE block): one of each kind of routing tensor the families hold
CASES = [
    ("deepseek_v3", "gate.e_score_correction_bias"),  # a correction bias, a buffer of the router
    ("deepseek_v3", "gate.weight"),  # the router's rows
    ("gpt_oss", "router.bias"),  # a router bias
    ("gemma4_text", "router.per_expert_scale"),  # per-expert scales of the weights
    ("gemma4_text", "router.scale"),  # the scale of the router's norm (not per expert)
    ("minimax_m2", "e_score_correction_bias"),  # a correction bias the block holds
    ("ernie4_5_moe", "gate.moe_statics.e_score_correction_bias"),  # a correction bias in a router submodule [1, E]
    ("ergo", "gate.e_score_correction_bias"),  # a router correction bias beside a router submodule's rows
    ("longcat_flash", "router.classifier.weight"),  # router rows [E + Z], the zero-computation experts' last
    ("dbrx", "router.layer.weight"),  # the router's rows, in a submodule of a router that returns the logits alone
    ("ergo", "experts.post_expert_norm.weight"),  # per-expert output norms [E, H]
    ("afmoe", "expert_bias"),  # a block's selection bias
]
BAD = {"nan": (float("nan"), "(1 NaN, 0 inf)"), "inf": (float("-inf"), "(0 NaN, 1 inf)")}


def _batches() -> list[dict[str, torch.Tensor]]:
    return [padded_batch(seed=s, max_id=90) for s in (1, 2)]


def _poisoned(tiny, family: str, inside: str, bad: str):
    """(model, its last MoE layer, the tensor's name, the message's middle part) with the last entry of the tensor
    ``inside`` the layer's block set to ``bad``."""
    model = tiny(family)
    layer = lp.find_moe_layers(model)[-1]
    name = f"{layer.name}.{inside}"
    owner, _, attr = name.rpartition(".")
    tensor = getattr(model.get_submodule(owner), attr).data
    tensor.view(-1)[-1] = BAD[bad][0]
    index = [int(i) for i in torch.unravel_index(torch.tensor(tensor.numel() - 1), tensor.shape)]
    said = (f"MoE layer {layer.index} ({layer.name}): routing tensor {name} {list(tensor.shape)} holds 1 NaN or inf "
            f"value {BAD[bad][1]}, the first at index {index}; ")
    return model, layer, name, said


def _refusal(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    return str(info.value)


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("family,inside", CASES)
def test_every_entry_point_refuses_a_non_finite_routing_tensor(tiny, tmp_path, family, inside, bad) -> None:
    model, layer, _, said = _poisoned(tiny, family, inside, bad)
    model.save_pretrained(tmp_path / "ckpt")

    def calibrate(source):
        return lp.collect_expert_stats(source, _batches(), criteria=("frequency",), progress=False)

    in_memory = _refusal(lambda: calibrate(model))
    assert in_memory.startswith(f"calibration, before batch 0, {said}its statistics would be skewed (the selection "
                                "reads it). "), in_memory
    assert _refusal(lambda: calibrate(tmp_path / "ckpt")) == in_memory

    scored = _refusal(lambda: lp.score_weights(model, "aimer", progress=False))
    assert scored.startswith(f"criterion 'aimer', {said}nothing was scored (the model routes on it). "), scored
    assert _refusal(lambda: lp.score_weights(tmp_path / "ckpt", "aimer", progress=False)) == scored
    by_norm = _refusal(lambda: lp.score_weights(tmp_path / "ckpt", "router_norm", progress=False))
    assert by_norm == scored.replace("'aimer'", "'router_norm'")  # the router's own tensors read in once

    plan = lp.select_experts(scores_for_layers(lp.find_moe_layers(model)), 0.25)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pruned = _refusal(lambda: lp.prune_experts(model, plan))
    assert pruned.startswith(f"prune_experts, {said}nothing was pruned or written (the pruned model would route on "
                             "it). "), pruned
    torch.testing.assert_close(model.state_dict(), before, rtol=0, atol=0, equal_nan=True)  # nothing changed
    assert lp.find_moe_layers(model)[-1].num_experts == layer.num_experts

    masked = _refusal(lambda: lp.mask_experts(model, plan).__enter__())
    assert masked.startswith(f"mask_experts, {said}nothing was masked (the masked model would route on it). "), masked
    assert not is_masked(model)
    for text in (in_memory, scored, pruned, masked):
        assert text.endswith("restore the tensor from an intact copy of the checkpoint (download or convert it "
                             "again)") and "\n" not in text


def test_a_clean_models_routing_tensors_are_checked_once_per_layer_and_pass(tiny, tmp_path, monkeypatch) -> None:
    """Three batches, in memory and streamed two batches a pass (each layer read twice): each layer's routing tensors
    are checked once per calibration, before its first batch, never per batch."""
    from lightprune.experts.calibration import observed

    calls = []
    record = observed.routing_tensors_record
    monkeypatch.setattr(observed, "routing_tensors_record", lambda layer: (calls.append(layer.index), record(layer))[1])
    model = tiny("deepseek_v3")
    batches = [padded_batch(seed=s, max_id=90) for s in (1, 2, 3)]
    indices = [layer.index for layer in lp.find_moe_layers(model)]
    reference = lp.collect_expert_stats(model, batches, criteria=("frequency",), progress=False)
    assert calls == indices
    calls.clear()
    model.save_pretrained(tmp_path / "ckpt")
    streamed = lp.collect_expert_stats(tmp_path / "ckpt", batches, criteria=("frequency",), progress=False,
                                       batches_per_pass=2)
    assert calls == indices
    for index in indices:
        assert torch.equal(streamed.raw("frequency", "all")[index], reference.raw("frequency", "all")[index])


def test_a_non_finite_tensor_of_a_later_layer_names_the_batch_it_was_found_before(tiny) -> None:
    """An observer resumed after 5 batches finds the tensor before its next batch, batch 5."""
    model, _, _, said = _poisoned(tiny, "deepseek_v3", "gate.e_score_correction_bias", "nan")
    observer = ExpertObserver(model, criteria=("frequency",))
    observer.load_state_dict({**observer.state_dict(), "batches_seen": 5})
    batch = _batches()[0]
    with observer, torch.no_grad(), pytest.raises(ValueError) as info:
        observer.begin_batch(batch)
        model(**batch)
        observer.check_routing()  # the queued checks, read
    assert str(info.value).startswith(f"calibration, before batch 5, {said}")

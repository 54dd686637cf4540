"""Non-finite values in calibration are refused, not summed: a NaN or inf in a MoE layer's router input or logits at a
token the statistics read stops the run naming the layer (index, module name), the batch (0-based index in the run)
and the non-finite tokens; padded positions the statistics exclude do not; a clean run's statistics are unchanged
(frequency: the router's own top-k counted by brute force). Scores with NaN / inf are refused by ``select_experts``
and the Spearman ranking, naming the layer and the experts, instead of being ordered."""

from __future__ import annotations

import math
from contextlib import contextmanager

import pytest
import torch
from fixtures import padded_batch

import lightprune as lp
from lightprune.experts.ranking import spearman
from lightprune.models import RoutingLimits

NAN_TOKEN = 95  # an id no batch below draws (they draw ids below 90)


def _batches() -> list[dict[str, torch.Tensor]]:
    """Three batches of 2 x 9 tokens, the second sample of each left-padded by 3: 15 real tokens a batch."""
    return [padded_batch(seed=s, max_id=90) for s in (1, 2, 3)]


def _stats(model_or_path, batches, **kwargs):
    return lp.collect_expert_stats(model_or_path, batches, criteria=("frequency", "reap", "ean"), progress=False,
                                   **kwargs)


@contextmanager
def _nan_router_input(router_weight: torch.Tensor, router_type: type, call: int, rows: list[int]):
    """NaN in ``rows`` (flat token positions) of what the router whose weight equals ``router_weight`` is called
    with, on its ``call``-th call (0-based): a global forward pre-hook, so that it reaches a model built elsewhere
    (a checkpoint's skeleton) too."""
    calls = [0]

    def hook(module, args):
        if type(module) is not router_type or not torch.equal(module.weight, router_weight):
            return None
        calls[0] += 1
        if calls[0] - 1 != call:
            return None
        hidden = args[0].clone()
        hidden.view(-1, hidden.shape[-1])[rows] = float("nan")
        return (hidden, *args[1:])

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()


def test_a_nan_token_embedding_is_refused_naming_the_layer_and_the_batch(tiny) -> None:
    model = tiny("qwen3_moe", seed=1)
    batches = _batches()
    batches[1]["input_ids"][0, 4] = NAN_TOKEN  # a real token of batch 1 only
    with torch.no_grad():
        model.get_input_embeddings().weight[NAN_TOKEN, 5] = float("nan")
    first = lp.find_moe_layers(model)[0]
    # the NaN key reaches every query of its sample (a causal mask adds to NaN scores): the 9 tokens of sample 0
    with pytest.raises(ValueError, match=r"calibration batch 1, MoE layer 0 \(model\.layers\.0\.mlp\): 9 of 15 tokens "
                                         r"have a NaN or inf router input \(9\) or router logits \(9\), the first at "
                                         r"sample 0, position 0") as info:
        lp.collect_expert_stats(model, batches, criteria=("frequency",), progress=False)
    assert first.name in str(info.value)


@pytest.mark.parametrize("family,what,count", [
    ("qwen3_moe", "router logits", 15),  # +-inf logits at every token
    ("gemma4_text", "routing weights", 15),  # no logits returned: the weights, NaN where a logit is +inf
])
def test_router_logits_that_overflow_are_refused_naming_its_layer(tiny, family, what, count) -> None:
    """A finite router row so large that its logits overflow (an inf router weight is refused before any batch:
    test_non_finite_routing_tensors.py)."""
    model = tiny(family, seed=1)
    second = lp.find_moe_layers(model)[1]
    with torch.no_grad():
        second.router_linear.weight[2] = 3e38
        if family == "gemma4_text":
            # Gemma 4's router input is RMS-normed and scaled by hidden ** -0.5: a logit overflows only where the
            # input sums past ~1.1, and only +inf (not -inf) makes its softmax NaN. A large input scale and a row of
            # the other sign give every token a +inf (or NaN) logit, whatever order the dot product sums in.
            second.router.scale.fill_(1e6)
            second.router_linear.weight[3] = -3e38
    with pytest.raises(ValueError, match=rf"calibration batch 0, MoE layer {second.index} \({second.name}\): {count} of 15 "
                                         rf"tokens have a NaN or inf router input \(0\) or {what} \({count}\)"):
        lp.collect_expert_stats(model, _batches(), criteria=("frequency",), progress=False)


@pytest.mark.parametrize("batch", [0, 1])
@pytest.mark.parametrize("where", ["memory", "checkpoint"])
def test_the_refusal_names_the_batch_of_a_later_layer(tiny, tmp_path, where, batch) -> None:
    """Layer 1's router input holds a NaN in one batch only; a checkpoint is calibrated a layer at a time (2 batches a
    pass: layer 1 sees batches 0 and 1 after layer 0 has seen both), and the refusal still names that batch."""
    model = tiny("qwen3_moe", seed=1).eval()
    layer = lp.find_moe_layers(model)[1]
    source = model
    if where == "checkpoint":
        model.save_pretrained(tmp_path / "ckpt")
        source = tmp_path / "ckpt"
    expected = rf"calibration batch {batch}, MoE layer 1 \({layer.name}\): 1 of 15 tokens .*at sample 1, position 4"
    with _nan_router_input(layer.router.weight.detach().clone(), type(layer.router), call=batch, rows=[13]), \
            pytest.raises(ValueError, match=expected):
        _stats(source, _batches(), **({"batches_per_pass": 2} if where == "checkpoint" else {}))


@torch.no_grad()
def _brute_force_frequency(model, batches) -> dict[int, torch.Tensor]:
    """Per MoE layer, how often each expert is among the router's top-k at a real (unpadded) token."""
    layers = lp.find_moe_layers(model)
    counts = {layer.index: torch.zeros(layer.num_experts, dtype=torch.float64) for layer in layers}
    valid: list[torch.Tensor] = []

    def count(index):
        def hook(module, args, output):
            selected = output[2].reshape(-1, output[2].shape[-1])[valid[0]]
            counts[index] += torch.bincount(selected.flatten(), minlength=counts[index].numel()).double()
        return hook

    handles = [layer.router.register_forward_hook(count(layer.index)) for layer in layers]
    try:
        for batch in batches:
            valid[:] = [batch["attention_mask"].reshape(-1).bool()]
            model(**batch)
    finally:
        for handle in handles:
            handle.remove()
    return counts


def test_a_clean_run_and_padding_are_unchanged(tiny) -> None:
    """The check refuses nothing finite: the frequency of a clean run is the router's top-k counted by brute force,
    and NaN router inputs at padded positions (excluded from every statistic) are not refused and leave the
    frequency as it was (the other statistics up to rounding: the experts then run other rows beside the real
    tokens in their matmuls)."""
    model = tiny("qwen3_moe", seed=1)
    batches = _batches()
    clean = _stats(model, batches)
    expected = _brute_force_frequency(model, batches)
    for index, want in expected.items():
        got = clean.raw("frequency", "all")[index]
        assert torch.equal(got.double(), want), index

    # the last layer (a NaN there reaches no later attention): rows 9-11 are the padding of batch 0's second sample
    layer = lp.find_moe_layers(model)[-1]
    with _nan_router_input(layer.router.weight.detach().clone(), type(layer.router), call=0, rows=[9, 10, 11]) as calls:
        padded = _stats(model, batches)
    assert calls[0] == len(batches)
    for criterion in clean.metadata["criteria"]:
        for index, want in clean.raw(criterion, "all").items():
            got = padded.raw(criterion, "all")[index]
            if criterion == "frequency":
                assert torch.equal(got, want), index
            else:
                torch.testing.assert_close(got, want, rtol=1e-5, atol=0, msg=f"{criterion} {index}")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_select_experts_refuses_non_finite_scores(bad) -> None:
    limits = {0: RoutingLimits(8, 2), 1: RoutingLimits(8, 2)}
    scores = {0: torch.arange(8.0), 1: torch.arange(8.0)}
    scores[1][2] = bad
    scores[1][5] = float("nan")
    with pytest.raises(ValueError, match=r"layer 1: non-finite scores .* for experts \[2, 5\]"):
        lp.select_experts(scores, 0.25, limits=limits)
    with pytest.raises(ValueError, match=r"layer 1: non-finite scores .* for experts \[2, 5\]"):
        lp.select_experts(scores, None, n_per_layer=2, limits=limits)
    with pytest.raises(ValueError, match=r"layer 1: non-finite scores .* for experts \[2, 5\]"):
        lp.select_experts(scores, 0.25, allocation="global", limits=limits)


def test_spearman_names_the_non_finite_experts() -> None:
    a, b = [0.1, math.nan, 0.3, 0.4], [1.0, 2.0, 3.0, math.inf]
    with pytest.raises(ValueError, match=r"layer 3: spearman got NaN or inf values at positions \(experts\) \[1\] of "
                                         r"the first and \[3\] of the second"):
        spearman(a, b, label="layer 3")
    assert spearman([1.0, 2.0, 3.0], [3.0, 1.0, 2.0]) == pytest.approx(-0.5)


def test_nan_pixels_are_refused_naming_the_first_layer_that_routes_them() -> None:
    """NaN pixels reach the language model as NaN image embeddings: the first MoE layer's router input holds them,
    and the refusal names that layer and the batch instead of handing NaN statistics to the ranking."""
    from lightprune.testing.batches import tiny_multimodal_batch
    from lightprune.testing.tiny import tiny_model

    model = tiny_model("qwen3_vl_moe")
    clean = tiny_multimodal_batch(model, seed=3)
    poisoned = dict(clean, pixel_values=clean["pixel_values"].clone())
    poisoned["pixel_values"][0, 0] = float("nan")
    first = lp.find_moe_layers(model)[0]
    with pytest.raises(ValueError, match=rf"calibration batch 1, MoE layer {first.index} \({first.name}\): .*NaN or inf "
                                         r"router input"):
        lp.collect_expert_stats(model, [clean, poisoned], subsets=("all", "vision"), progress=False)

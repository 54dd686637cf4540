"""The per-layer load-balancing loss and the balance figures, against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from lightprune.finetune.balance import per_layer_balance_loss, routing_balance


def _by_hand(logits: torch.Tensor, top_k: int, keep: list[bool]) -> float:
    """E sum_e f_e P_e of one layer, token by token."""
    num = logits.shape[1]
    counts, probs, tokens = [0.0] * num, [0.0] * num, 0
    for row, kept in zip(logits.tolist(), keep):
        if not kept:
            continue
        tokens += 1
        z = sum(math.exp(v) for v in row)
        p = [math.exp(v) / z for v in row]
        for e in sorted(range(num), key=lambda e: -p[e])[:top_k]:
            counts[e] += 1
        for e in range(num):
            probs[e] += p[e]
    return num * sum(c / (tokens * top_k) * q / tokens for c, q in zip(counts, probs))


def test_the_loss_is_the_mean_of_each_layers_switch_loss() -> None:
    gen = torch.Generator().manual_seed(0)
    layers = [torch.randn(12, 8, generator=gen) * 2 for _ in range(3)]
    mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])  # 2 rows x 6 positions, two padded
    keep = [bool(v) for v in mask.reshape(-1)]
    want = sum(_by_hand(l, 2, keep) for l in layers) / 3
    assert float(per_layer_balance_loss(layers, 2, mask)) == pytest.approx(want, rel=1e-6)
    assert float(per_layer_balance_loss(layers, 2)) == pytest.approx(
        sum(_by_hand(l, 2, [True] * 12) for l in layers) / 3, rel=1e-6)


def test_a_layer_that_starves_experts_is_penalised_where_the_pooled_loss_is_not() -> None:
    """Layer 0 routes everything to experts 0-1, layer 1 to experts 2-3: pooled, the four experts share the
    routing evenly; per layer, each layer uses half its experts."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    big = 20.0
    first = torch.full((8, 4), -big)
    first[:, :2] = big
    second = torch.full((8, 4), -big)
    second[:, 2:] = big
    pooled = float(load_balancing_loss_func((first, second), num_experts=4, top_k=2)) / 2  # transformers: k x ours
    assert pooled == pytest.approx(1.0, abs=1e-6)
    assert float(per_layer_balance_loss([first, second], 2)) == pytest.approx(2.0, abs=1e-6)
    uniform = torch.zeros(8, 4)
    uniform[:, :] = torch.tensor([0.0, 1e-4, 2e-4, 3e-4])  # ties broken, probabilities ~uniform
    assert float(per_layer_balance_loss([uniform], 2)) == pytest.approx(1.0, abs=1e-3)
    with pytest.raises(ValueError, match="no router logits"):
        per_layer_balance_loss([], 2)


def test_routing_balance_figures() -> None:
    assert routing_balance(torch.tensor([5, 5, 5, 5])) == pytest.approx(
        {"min_share": 0.25, "min_share_x_experts": 1.0, "entropy": 1.0})
    shares = [0.0, 0.25, 0.25, 0.5]
    entropy = -sum(s * math.log(s) for s in shares if s) / math.log(4)
    assert routing_balance(torch.tensor([0, 1, 1, 2])) == pytest.approx(
        {"min_share": 0.0, "min_share_x_experts": 0.0, "entropy": entropy})
    with pytest.raises(ValueError, match="routed nothing"):
        routing_balance(torch.zeros(4))


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_vl_moe"])  # the text and the multimodal testbed's family
def test_the_module_adds_the_per_layer_loss_when_asked(family: str) -> None:
    from lightprune.finetune import MoECausalLM
    from lightprune.testing.batches import tiny_multimodal_batch

    module = MoECausalLM(tiny=family, router_aux_loss_coef=0.5, aux_loss="per_layer")
    module.configure_model()
    if family == "qwen3_moe":
        ids = torch.randint(3, 100, (2, 10), generator=torch.Generator().manual_seed(1))
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    else:
        batch = dict(tiny_multimodal_batch(module.model))
    logits, labels, aux = module._shifted(batch, aux=True)
    out = module.model(**batch, output_router_logits=True)
    layers = [layer for layer in out.router_logits if layer is not None]
    assert len(layers) == module.model.config.get_text_config().num_hidden_layers
    assert float(aux) == pytest.approx(float(per_layer_balance_loss(layers, 2, batch["attention_mask"])))
    with pytest.raises(ValueError, match="aux_loss must be one of"):
        MoECausalLM(tiny="qwen3_moe", aux_loss="pooled")

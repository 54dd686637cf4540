"""taylor_importance (MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), appendix A.1)
against an autograd reference built independently: an explicit eager attention with one shared scalar gate per
(layer, head, path) and FFN gates per (layer, channel, modality) in a plain pre-hook, one backward per sample of
that sample's answer loss (batches padded, samples of different lengths and modalities, so the
one-backward-per-batch separation is checked)."""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures.width import dense_lm, ffn_plan, lm_batch, random_keep, reference_logits

from lightprune.testing.batches import tiny_multimodal_batch
from lightprune.width.modality import token_modality
from lightprune.width.paths import MODALITIES, TEXT, VISION
from lightprune.width.plan import WidthPlan
from lightprune.width.taylor import WidthScores, taylor_importance


def _with_labels(batch, answer=3):
    """labels = the last ``answer`` real tokens of each sample, -100 elsewhere."""
    labels = torch.full_like(batch["input_ids"], -100)
    for b, row in enumerate(batch["attention_mask"]):
        last = int(row.nonzero().max())
        labels[b, last - answer + 1:last + 1] = batch["input_ids"][b, last - answer + 1:last + 1]
    return {**batch, "labels": labels, "task_ids": torch.arange(len(labels))}


def _sample_losses(logits, labels):
    losses = []
    for b in range(len(labels)):
        terms = [-torch.log_softmax(logits[b, t].double(), -1)[labels[b, t + 1]]
                 for t in range(labels.shape[1] - 1) if labels[b, t + 1] != -100]
        losses.append(torch.stack(terms).mean())
    return losses


def _reference(model, batch, vision_ids, attention=True, ffn=False, keep=None, ffn_keep=None):
    """Mean over samples of |dL_b/dg| (/ |Q_p,b| for attention) with shared scalar gates, per-sample backward."""
    plan = WidthPlan.dense(model)
    modality = token_modality(batch["input_ids"], batch["attention_mask"], vision_ids)
    attn_gates = {l: torch.ones(h, 3, dtype=torch.float64, requires_grad=True) for l, h in plan.num_heads.items()}
    ffn_gates = {l: torch.ones(m, 2, requires_grad=True) for l, m in plan.intermediate_size.items()}

    def ffn_hook(layer):
        def hook(module, args):
            h = args[0]
            factor = torch.ones_like(h)
            for k, (mu, code) in enumerate((("vision", VISION), ("text", TEXT))):
                rows = modality == code
                scale = ffn_gates[layer][:, k] if ffn else torch.ones(h.shape[-1])
                if ffn_keep is not None:
                    scale = scale * ffn_keep[layer][mu].float()
                factor = torch.where(rows[..., None], scale, factor)
            return (h * factor,)
        return hook

    inputs = {k: v for k, v in batch.items() if k not in ("labels", "task_ids")}
    logits = reference_logits(model, inputs, keep, attn_gates if attention else None, vision_ids,
                              {l: ffn_hook(l) for l in ffn_gates})
    attn = {l: torch.zeros(h, 3, dtype=torch.float64) for l, h in plan.num_heads.items()}
    ffn_scores = {l: torch.zeros(m, 2, dtype=torch.float64) for l, m in plan.intermediate_size.items()}
    losses = _sample_losses(logits, batch["labels"])
    for b, loss in enumerate(losses):
        wrt = list(attn_gates.values()) if attention else list(ffn_gates.values())
        grads = torch.autograd.grad(loss, wrt, retain_graph=True)
        if attention:
            counts = [(modality[b] == VISION).sum(), (modality[b] == TEXT).sum(), (modality[b] == TEXT).sum()]
            for l, g in zip(attn_gates, grads):
                for p, n in enumerate(counts):
                    attn[l][:, p] += g[:, p].abs() / n if n else 0.0
        else:
            for l, g in zip(ffn_gates, grads):
                ffn_scores[l] += g.double().abs()
    n = len(losses)
    return {l: s / n for l, s in attn.items()}, {l: s / n for l, s in ffn_scores.items()}


@pytest.fixture(scope="module")
def vl():
    from lightprune.testing.tiny import tiny_model

    return tiny_model("qwen3_vl_moe")


def _state(model):
    hooks = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())
    return hooks, [m.training for m in model.modules()], model.config.text_config._attn_implementation


def test_attention_scores_match_per_sample_autograd(vl):
    model = copy.deepcopy(vl)
    model.model.visual.train()  # mixed modes must survive the pass
    batch = _with_labels(tiny_multimodal_batch(model, batch_size=3, images_per_sample=2, seed=4, pad_last=3))
    before = _state(model)
    scores = taylor_importance(model, [batch], progress=False)
    assert _state(model) == before
    assert all(p.grad is None for p in model.parameters())
    expected, _ = _reference(model, batch, {120, 121})
    assert scores.num_samples == 3 and scores.ffn == {}
    for layer, exp in expected.items():
        assert scores.attn[layer].dtype == torch.float64
        torch.testing.assert_close(scores.attn[layer], exp, atol=1e-7, rtol=2e-4)
    assert (expected[0] > 0).all()
    # in the last layer a vision query's output reaches no answer logit: V2V has no first-order effect
    assert (expected[1][:, 0] == 0).all() and (expected[1][:, 1:] > 0).all()


def test_dense_lm_attention_and_ffn_scores(tmp_path, monkeypatch):
    model = dense_lm()
    batch = _with_labels(lm_batch(), answer=2)  # sample 2 is text only: no V2V / T2V queries
    scores = taylor_importance(model, [batch], attention=True, ffn=True, progress=False)
    attn, _ = _reference(model, batch, {120})
    _, ffn = _reference(model, batch, {120}, attention=False, ffn=True)
    for layer in (0, 1):
        torch.testing.assert_close(scores.attn[layer], attn[layer], atol=1e-7, rtol=2e-4)
        for k, mu in enumerate(MODALITIES):
            torch.testing.assert_close(scores.ffn[layer][mu], ffn[layer][:, k], atol=1e-7, rtol=2e-4)
            assert scores.ffn[layer][mu].shape == (24,) and (scores.ffn[layer][mu] > 0).any()
    assert WidthScores.load(scores.save(tmp_path / "s.json")).to_dict() == scores.to_dict()
    again = WidthScores.load(tmp_path / "s.json")
    assert all(torch.equal(again.attn[l], scores.attn[l]) for l in scores.attn)
    # the same samples split over two batches give the same mean (per-sample separation)
    split = [{k: v[:2] for k, v in batch.items()}, {k: v[2:] for k, v in batch.items()}]
    two = taylor_importance(model, split, attention=True, ffn=True, progress=False)
    assert two.num_samples == 3
    for layer in (0, 1):
        torch.testing.assert_close(two.attn[layer], scores.attn[layer], atol=1e-8, rtol=1e-5)
    # attention weights recomputed one query row at a time (keys cut at the row's last visible key) give the
    # same scores
    from lightprune.width import gates

    monkeypatch.setattr(gates, "CHUNK_ELEMENTS", 1)
    rows = taylor_importance(model, [batch], attention=True, ffn=False, progress=False)
    for layer in (0, 1):
        torch.testing.assert_close(rows.attn[layer], scores.attn[layer], atol=1e-9, rtol=1e-6)


def test_plan_is_applied_during_the_pass():
    model = dense_lm()
    batch = _with_labels(lm_batch(), answer=2)
    dense = WidthPlan.dense(model)
    keep = random_keep(dense, [0, 1, 2], seed=7)
    ffn_keep = ffn_plan(dense, seed=3)
    plan = dense.replace(attn_keep=keep, ffn_keep=ffn_keep)
    plain = taylor_importance(model, [batch], attention=False, ffn=True, progress=False)
    masked = taylor_importance(model, [batch], attention=False, ffn=True, plan=plan, progress=False)
    _, expected = _reference(model, batch, {120}, attention=False, ffn=True, keep=keep, ffn_keep=ffn_keep)
    for layer in (0, 1):
        for k, mu in enumerate(MODALITIES):
            torch.testing.assert_close(masked.ffn[layer][mu], expected[layer][:, k], atol=1e-7, rtol=2e-4)
            assert (masked.ffn[layer][mu][~ffn_keep[layer][mu]] == 0).all()
        assert not torch.allclose(masked.ffn[layer]["text"], plain.ffn[layer]["text"])
    attn_masked = taylor_importance(model, [batch], plan=plan, progress=False)
    attn_expected, _ = _reference(model, batch, {120}, keep=keep, ffn_keep=ffn_keep)
    for layer in (0, 1):
        torch.testing.assert_close(attn_masked.attn[layer], attn_expected[layer], atol=1e-7, rtol=2e-4)


def test_errors(vl):
    model = copy.deepcopy(vl)
    batch = tiny_multimodal_batch(model, seed=1)
    with pytest.raises(ValueError, match="batch 0 has no 'labels'"):
        taylor_importance(model, [batch], progress=False)
    no_answer = {**batch, "labels": torch.full_like(batch["input_ids"], -100)}
    with pytest.raises(ValueError, match="batch 0: labels mark no answer token"):
        taylor_importance(model, [no_answer], progress=False)
    one_empty = _with_labels(batch)
    one_empty["labels"][1] = -100
    with pytest.raises(ValueError, match=r"samples \[1\] have no answer token"):
        taylor_importance(model, [one_empty], progress=False)
    with pytest.raises(ValueError, match="every FFN of Qwen3VLMoeForConditionalGeneration is an MoE block"):
        taylor_importance(model, [_with_labels(batch)], ffn=True, progress=False)
    with pytest.raises(ValueError, match="Qwen2ForCausalLM .* has no image_token_id"):
        taylor_importance(dense_lm(image_token_id=None), [_with_labels(lm_batch())], progress=False)
    with pytest.raises(ValueError, match="nothing to score"):
        taylor_importance(model, [batch], attention=False, progress=False)
    with pytest.raises(ValueError, match="no batches"):
        taylor_importance(model, [], progress=False)
    # everything was removed after each error
    assert model.config.text_config._attn_implementation == "sdpa"
    assert sum(len(m._forward_pre_hooks) for m in model.modules()) == 0


def test_dense_mllm_scores_match_per_sample_autograd():
    from lightprune.testing.tiny import tiny_model

    model = tiny_model("qwen2_5_vl")
    batch = _with_labels(tiny_multimodal_batch(model, batch_size=3, images_per_sample=1, seed=2, pad_last=2), answer=2)
    scores = taylor_importance(model, [batch], attention=True, ffn=True, progress=True)
    attn, _ = _reference(model, batch, {120, 121})
    _, ffn = _reference(model, batch, {120, 121}, attention=False, ffn=True)
    for layer in (0, 1):
        torch.testing.assert_close(scores.attn[layer], attn[layer], atol=1e-7, rtol=2e-4)
        for k, mu in enumerate(MODALITIES):
            torch.testing.assert_close(scores.ffn[layer][mu], ffn[layer][:, k], atol=1e-7, rtol=2e-4)
    assert (scores.ffn[0]["vision"] > 0).any() and (scores.ffn[0]["text"] > 0).any()


def test_all_reduce_under_a_process_group(tmp_path):
    """Under torch.distributed the sums and the count go through one all_reduce (one gloo rank here)."""
    import torch.distributed as dist

    model = dense_lm()
    batch = _with_labels(lm_batch(), answer=2)
    local = taylor_importance(model, [batch], attention=True, ffn=True, progress=False)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        calls = []
        original = dist.all_reduce
        dist.all_reduce = lambda tensor, *a, **k: calls.append(tensor.numel()) or original(tensor, *a, **k)
        try:
            reduced = taylor_importance(model, [batch], attention=True, ffn=True, progress=False)
        finally:
            dist.all_reduce = original
    finally:
        dist.destroy_process_group()
    assert calls == [1 + 2 * 4 * 3 + 2 * 24 * 2]
    assert reduced.num_samples == 3
    for layer in (0, 1):
        assert torch.equal(reduced.attn[layer], local.attn[layer])
        assert all(torch.equal(reduced.ffn[layer][mu], local.ffn[layer][mu]) for mu in MODALITIES)


class _PerHeadGrids(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the shape of every op output that is a per-head query x key grid: [B, H', Q, K] with H' > 1 heads
    (all of them or a group's)."""

    def __init__(self, batch, q_len):
        super().__init__()
        self.batch, self.q_len, self.seen = batch, q_len, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[1] > 1 and t.shape[0] == self.batch \
                    and t.shape[2] == self.q_len and t.shape[3] == self.q_len:
                self.seen.append((func.__name__, tuple(t.shape)))
        return out


def test_no_per_head_query_key_grid(monkeypatch):
    """Neither the gated pass nor masked attention builds a [B, heads, Q, K] tensor (heads grouped by their
    keep flags, one [B, 1, Q, K] mask per group; the gate backward recomputes A in row chunks). The probe is
    checked to see such a grid where one exists (an eager attention's weights)."""
    from lightprune.width import gates
    from lightprune.width.mask import mask_width

    monkeypatch.setattr(gates, "CHUNK_ELEMENTS", 64)  # a chunk holds fewer rows than the sequence
    model = dense_lm()
    batch = _with_labels({k: v[:2] for k, v in lm_batch().items()}, answer=2)  # B = 2: no other dim is 2
    dense = WidthPlan.dense(model)
    plan = dense.replace(attn_keep=random_keep(dense, [0, 1, 2], seed=7))
    assert len({tuple(r) for r in plan.attn_keep[0].tolist()}) > 1  # several head groups
    shape = (2, 10)  # batch, tokens
    for p in (None, plan):
        with _PerHeadGrids(*shape) as probe:
            taylor_importance(model, [batch], attention=True, ffn=True, plan=p, progress=False)
        assert probe.seen == []
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    with torch.no_grad(), mask_width(model, plan), _PerHeadGrids(*shape) as probe:
        model(**inputs)
    assert probe.seen == []
    eager = dense_lm()
    eager.config._attn_implementation = "eager"
    with torch.no_grad(), _PerHeadGrids(*shape) as probe:
        eager(**inputs)
    assert probe.seen

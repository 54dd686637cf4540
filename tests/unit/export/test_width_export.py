"""MWOP export (paper 002 D.5): path-sparse attention + compact FFN swapped in, save / reload, equal to masking."""

from __future__ import annotations

import json

import pytest
import torch

from lightprune.export import (
    MANIFEST_FILE,
    ExportVerificationError,
    attach_width_kernels,
    load_pruned,
    save_width_pruned,
)
from lightprune.models.tiny_batches import tiny_multimodal_batch
from lightprune.width.mask import mask_width
from lightprune.width.plan import WidthPlan


def _random_plan(model, seed: int) -> WidthPlan:
    gen = torch.Generator().manual_seed(seed)
    dense = WidthPlan.dense(model)
    attn = {l: torch.rand(k.shape, generator=gen) > 0.4 for l, k in dense.attn_keep.items()}
    ffn = {l: {"vision": torch.rand(m["vision"].shape, generator=gen) > 0.5,
               "text": torch.rand(m["text"].shape, generator=gen) > 0.2} for l, m in dense.ffn_keep.items()}
    return dense.replace(attn_keep=attn, ffn_keep=ffn)


def _logits(model, batch):
    with torch.no_grad():
        return model(**batch, use_cache=False).logits


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava_onevision"])
@pytest.mark.parametrize("backend", ["sdpa", "flex", "span"])
def test_attached_kernels_equal_the_masked_model(tiny, family, backend):
    model = tiny(family)
    plan = _random_plan(model, seed=1)
    batch = tiny_multimodal_batch(model, batch_size=2, text_tokens=(3, 5), seed=2, pad_last=2)
    dense = _logits(model, batch)
    with mask_width(model, plan):
        masked = _logits(model, batch)
    assert (masked - dense).abs().max() > 1e-3  # the plan changes the model
    handle = attach_width_kernels(model, plan, align=8, attention_backend=backend)
    kernels = _logits(model, batch)
    valid = batch["attention_mask"].bool()
    assert (kernels - masked).abs()[valid].max() < 1e-5
    handle.remove()
    assert torch.equal(_logits(model, batch), dense)


def test_save_and_reload_equals_the_masked_model(tiny, tmp_path):
    model = tiny("qwen2_5_vl")
    plan = _random_plan(model, seed=3)
    batch = tiny_multimodal_batch(model, batch_size=2, seed=4)
    result = save_width_pruned(model, plan, tmp_path / "ckpt", probe=batch, align=16, metadata={"atr": 99.5})
    out = result.path
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert result.manifest == manifest and result.align == 16
    assert result.pruned_fractions == manifest["pruned_fractions"]
    assert result.verification == manifest["verification"] and result.max_abs_diff < 1e-5
    assert manifest["format"] == "lightprune-width-export" and manifest["align"] == 16 and manifest["atr"] == 99.5
    assert manifest["pruned_fractions"]["v2v"] == plan.pruned_fraction("v2v")
    assert WidthPlan.load(out / "width_plan.json") == plan
    reloaded = load_pruned(out)
    assert reloaded.lightprune_width.modules  # compact FFNs are in
    with mask_width(model, plan):
        masked = _logits(model, batch)
    valid = batch["attention_mask"].bool()
    assert (_logits(reloaded, batch) - masked).abs()[valid].max() < 1e-5
    reloaded.lightprune_width.remove()
    assert (_logits(reloaded, batch) - _logits(model, batch)).abs().max() < 1e-5  # the dense weights are all there


def test_a_wrong_reference_fails_verification_and_writes_nothing(tiny, tmp_path):
    model = tiny("qwen2_5_vl")
    plan = _random_plan(model, seed=5)
    batch = tiny_multimodal_batch(model, batch_size=1, seed=6, pad_last=0)
    with pytest.raises(ExportVerificationError, match="masked model"):
        save_width_pruned(model, plan, tmp_path / "ckpt", probe=batch, reference_logits=_logits(model, batch))
    assert not (tmp_path / "ckpt").exists()


def test_bad_inputs_are_named(tiny, tmp_path, monkeypatch):
    model = tiny("qwen2_5_vl")
    plan = _random_plan(model, seed=7)
    with pytest.raises(ValueError, match="align"):
        save_width_pruned(model, plan, tmp_path / "a", align=0)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(Exception, match="triton"):
        attach_width_kernels(model, plan, attention_backend="triton")
    handle = attach_width_kernels(model, plan)
    with pytest.raises(ValueError, match="kernels attached"):
        save_width_pruned(model, plan, tmp_path / "b")
    handle.remove()
    with pytest.raises(ValueError, match="cuda"):
        attach_width_kernels(model, plan, attention_backend="cuda")

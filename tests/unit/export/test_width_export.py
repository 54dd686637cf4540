"""MWOP export (MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), appendix D.5):
path-sparse attention + compact FFN swapped in, save / reload, equal to masking."""

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
from lightprune.testing.batches import tiny_multimodal_batch
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


def _spy_backends(monkeypatch) -> list[str]:
    """The backend of every path-sparse attention call the model makes, in layer order."""
    import lightprune.width.attention as attention

    seen, real = [], attention.path_sparse_attention

    def spy(*args, backend, **kwargs):
        seen.append(backend)
        return real(*args, backend=backend, **kwargs)

    monkeypatch.setattr(attention, "path_sparse_attention", spy)
    return seen


def test_the_export_records_a_backend_per_layer_and_device_and_the_reload_runs_it(tiny, tmp_path, monkeypatch):
    model = tiny("qwen2_5_vl")
    plan = _random_plan(model, seed=3)
    plan = plan.replace(attn_keep={**plan.attn_keep, 0: torch.ones_like(plan.attn_keep[0])})  # layer 0 keeps all
    batch = tiny_multimodal_batch(model, batch_size=2, seed=4)
    out = save_width_pruned(model, plan, tmp_path / "ckpt", probe=batch).path
    record = json.loads((out / MANIFEST_FILE).read_text())["attention_kernels"]
    # the layout is the probe's first sample: SYSTEM before the first image token, the image, TEXT after
    ids = batch["input_ids"][0].tolist()
    image = int(model.config.image_token_id)
    first, last = ids.index(image), len(ids) - 1 - ids[::-1].index(image)
    assert record["layout"][0] == ["system", first] and sum(n for _, n in record["layout"]) == len(ids)
    assert sum(n for name, n in record["layout"] if name == "vision") == ids.count(image) and last < len(ids) - 1
    pruned = [str(l) for l in sorted(plan.attn_keep) if not plan.attn_keep[l].all()]
    assert pruned and "0" not in pruned
    for device in ("cpu", "cuda"):
        entry = record["devices"][device]
        assert sorted(entry["backends"]) == sorted(pruned) == sorted(entry["seconds"])
        for layer, backend in entry["backends"].items():  # the cheapest estimate, as recorded
            assert backend == min(("sdpa", "span", "flex"), key=entry["seconds"][layer].__getitem__)
    seen = _spy_backends(monkeypatch)
    reloaded = load_pruned(out)
    routes = reloaded.lightprune_width.hooks.routes
    chosen = {str(l): r.backend["cpu"] for l, r in routes.items() if not r.all_kept}
    assert chosen == record["devices"]["cpu"]["backends"]
    _logits(reloaded, batch)
    assert seen == [record["devices"]["cpu"]["backends"][l] for l in pruned]
    # a hand-made choice is what runs, and it still equals the masked model
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    forced = dict.fromkeys(pruned, "span") | {pruned[0]: "flex"}
    manifest["attention_kernels"]["devices"]["cpu"]["backends"] = forced
    (out / MANIFEST_FILE).write_text(json.dumps(manifest))
    seen.clear()
    reloaded = load_pruned(out)
    got = _logits(reloaded, batch)
    assert seen == [forced[l] for l in pruned]
    with mask_width(model, plan):
        masked = _logits(model, batch)
    assert (got - masked).abs()[batch["attention_mask"].bool()].max() < 1e-5
    seen.clear()
    _logits(load_pruned(out, attention_backend="sdpa"), batch)  # one named backend overrides the record
    assert seen == ["sdpa"] * len(pruned)


def test_an_export_without_a_recorded_choice_runs_masked_sdpa_and_a_bad_record_is_named(tiny, tmp_path, monkeypatch):
    model = tiny("qwen2_5_vl")
    plan = _random_plan(model, seed=8)
    batch = tiny_multimodal_batch(model, batch_size=1, seed=9, pad_last=0)
    layout = [("system", 3), ("vision", 20), ("text", 9)]
    out = save_width_pruned(model, plan, tmp_path / "ckpt", probe=batch, attention_layout=layout).path
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["attention_kernels"]["layout"] == [list(run) for run in layout]
    manifest["attention_kernels"]["devices"]["cpu"]["backends"]["1"] = "cudnn"
    (out / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"layer 1 on 'cpu' records attention backend 'cudnn'"):
        load_pruned(out)
    del manifest["attention_kernels"]  # as exports before the choice was recorded
    (out / MANIFEST_FILE).write_text(json.dumps(manifest))
    seen = _spy_backends(monkeypatch)
    _logits(load_pruned(out), batch)
    assert seen and set(seen) == {"sdpa"}
    with pytest.raises(ValueError, match="unknown modality 'image'"):
        save_width_pruned(model, plan, tmp_path / "bad", probe=batch, attention_layout=[("image", 4)])
    assert not (tmp_path / "bad").exists()


def test_per_layer_backends_are_checked_by_name(tiny):
    model = tiny("qwen2_5_vl")
    plan = _random_plan(model, seed=10)
    pruned = [l for l in sorted(plan.attn_keep) if not plan.attn_keep[l].all()]
    with pytest.raises(ValueError, match=rf"names no backend for layers \[{pruned[-1]}\]"):
        attach_width_kernels(model, plan, attention_backend={l: "span" for l in pruned[:-1]})
    with pytest.raises(ValueError, match=rf"layer {pruned[0]}: 'fast' is not one of"):
        attach_width_kernels(model, plan, attention_backend={l: {"cpu": "fast"} for l in pruned})
    with pytest.raises(TypeError, match="attention_backend must be a backend name, a mapping"):
        attach_width_kernels(model, plan, attention_backend=3)
    handle = attach_width_kernels(model, plan, attention_backend={l: {"cuda": "flex"} for l in pruned})
    assert all(handle.hooks.routes[l].backend == {"cuda": "flex"} for l in pruned)  # cpu: masked SDPA
    handle.remove()


def test_a_given_profile_decides_the_recorded_choice(tiny, tmp_path):
    """attention_profiles replaces the built-in estimates of a device type: a profile where FlexAttention costs
    nothing chooses it on every pruned layer, and the reload verified runs it (exactly)."""
    import dataclasses

    from lightprune.width.kernels import PROFILES

    model = tiny("qwen2_5_vl")
    plan = _random_plan(model, seed=11)
    batch = tiny_multimodal_batch(model, batch_size=1, seed=12, pad_last=0)
    free_flex = dataclasses.replace(PROFILES["cpu"], flex_pair_s=0.0, block_mask_element_s=0.0)
    result = save_width_pruned(model, plan, tmp_path / "ckpt", probe=batch, attention_profiles={"cpu": free_flex})
    record = result.manifest["attention_kernels"]["devices"]["cpu"]
    pruned = [str(l) for l in sorted(plan.attn_keep) if not plan.attn_keep[l].all()]
    assert record["backends"] == dict.fromkeys(pruned, "flex") and record["profile"]["flex_pair_s"] == 0.0
    assert result.verification["attention_backends"] == dict.fromkeys(pruned, "flex")
    with pytest.raises(TypeError, match=r"profiles\['cuda'\] must be a KernelProfile, got dict"):
        save_width_pruned(model, plan, tmp_path / "bad", probe=batch, attention_profiles={"cuda": {}})

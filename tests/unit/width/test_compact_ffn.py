"""CompactModalityFFN and swap_compact_ffn (MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient
MLLMs"), appendix D.5) against (a) an explicit per-token channel zeroing written here and (b) the model's MLP under
mask_width with the same FFN masks; the prefill benchmark's --quick mode runs so the script cannot rot."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch
from fixtures import REPO
from fixtures.width import dense_lm
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from lightprune.testing.batches import tiny_multimodal_batch
from lightprune.testing.tiny import TINY_DENSE_MLLMS
from lightprune.width import swap as swap_module
from lightprune.width.kernels.compact_ffn import CompactModalityFFN, split_tokens
from lightprune.width.layers import find_width_layers, vision_token_ids
from lightprune.width.mask import mask_width
from lightprune.width.modality import token_modality
from lightprune.width.paths import MODALITIES, PAD, SYSTEM, TEXT, VISION
from lightprune.width.plan import WidthPlan
from lightprune.width.swap import swap_compact_ffn

ROOT = REPO


def qwen2_mlp(d=48, m=200, bias=False, seed=0):
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

    torch.manual_seed(seed)
    mlp = Qwen2MLP(Qwen2Config(hidden_size=d, intermediate_size=m))
    if bias:  # a biased gated MLP (not Qwen2's), to check the packed biases and the zero padding
        for name in ("gate_proj", "up_proj", "down_proj"):
            old = getattr(mlp, name)
            new = nn.Linear(old.in_features, old.out_features, bias=True)
            with torch.no_grad():
                new.weight.copy_(old.weight)
                new.bias.normal_()
            setattr(mlp, name, new)
    return mlp.eval()


def reference(mlp, x, modality, keep):
    """Mask mode written out: h = act(gate x) * up x, channels zeroed per token modality, then down."""
    h = mlp.act_fn(x @ mlp.gate_proj.weight.T + (0 if mlp.gate_proj.bias is None else mlp.gate_proj.bias))
    h = h * (x @ mlp.up_proj.weight.T + (0 if mlp.up_proj.bias is None else mlp.up_proj.bias))
    factor = torch.ones_like(h)
    factor[modality == VISION] = keep["vision"].to(h.dtype)
    factor[modality == TEXT] = keep["text"].to(h.dtype)
    out = (h * factor) @ mlp.down_proj.weight.T
    return out if mlp.down_proj.bias is None else out + mlp.down_proj.bias


def random_inputs(d, B=2, T=57, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, d, generator=gen).to(dtype)
    modality = torch.full((B, T), TEXT, dtype=torch.int8)
    modality[:, :3] = SYSTEM
    modality[:, 5:40] = VISION
    modality[1, -4:] = PAD
    return x, modality


def random_keep(m, vision=0.5, text=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {"vision": torch.rand(m, generator=gen) < vision, "text": torch.rand(m, generator=gen) < text}


def assert_close_to_scale(got, expected, rel=1e-6):
    scale = expected.abs().max().item()
    diff = (got - expected).abs().max().item()
    assert diff <= rel * scale, f"max abs diff {diff:.3g} > {rel} x output scale {scale:.3g}"


@pytest.mark.parametrize("align", [1, 8, 64])
@pytest.mark.parametrize("vision,text,layout", [(0.4, 1.0, "shared"), (1.0, 0.6, "shared"), (0.4, 0.7, "grouped"),
                                                (1.0, 1.0, "dense")])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_explicit_channel_zeroing(align, vision, text, layout, bias):
    mlp = qwen2_mlp(bias=bias)
    keep = random_keep(200, vision=vision, text=text, seed=align)
    compact = CompactModalityFFN.from_mlp(mlp, keep, align=align)
    assert compact.layout == layout
    for mu in MODALITIES:
        k = int(keep[mu].sum())
        assert compact.kept[mu] == k
        assert compact.width[mu] == (None if k == 200 else min(200, align * -(-k // align)))
    x, modality = random_inputs(48)
    with torch.no_grad():
        got = compact(x, modality)
        expected = reference(mlp, x, modality, keep)
        assert_close_to_scale(got, expected)
        # SYSTEM / PAD tokens (and a modality that keeps every channel) run the full FFN
        full = mlp(x)
        rows = (modality == SYSTEM) | (modality == PAD)
        for mu, code in (("vision", VISION), ("text", TEXT)):
            if compact.width[mu] is None:
                rows |= modality == code
        assert_close_to_scale(got[rows], full[rows])
        # the decoder residual fused into the GEMM / scatter: residual + FFN(x) up to rounding
        residual = torch.randn_like(x)
        assert_close_to_scale(compact.forward_residual(x, residual, modality), residual + got)
        # one modality only (no gather), and decode-like single tokens
        for code in (VISION, TEXT, SYSTEM):
            same = torch.full_like(modality, code)
            assert_close_to_scale(compact(x, same), reference(mlp, x, same, keep))
        assert_close_to_scale(compact(x[:, -1:], modality[:, -1:]), expected[:, -1:])


@pytest.mark.parametrize("align", [1, 8, 64])
@pytest.mark.parametrize("vision,text", [(0.4, 1.0), (1.0, 0.6), (0.0, 1.0)])
@pytest.mark.parametrize("bias", [False, True])
def test_shared_weights_match_explicit_zeroing_and_restore_bitwise(align, vision, text, bias):
    """share_weights: slices of the MLP's own (permuted) weights, no packed copy; the same outputs as the explicit
    zeroing (alignment channels zeroed for the pruned tokens, an empty kept set a zero update); the weights cannot be
    saved while permuted and come back bitwise."""
    mlp = qwen2_mlp(bias=bias)
    keep = random_keep(200, vision=vision, text=text, seed=align)
    x, modality = random_inputs(48)
    original = {name: t.clone() for name, t in mlp.state_dict().items()}
    residual = torch.randn_like(x)
    with torch.no_grad():
        expected = reference(mlp, x, modality, keep)
        singles = {code: reference(mlp, x, torch.full_like(modality, code), keep) for code in (VISION, TEXT, SYSTEM)}
        compact = CompactModalityFFN(mlp, keep, align=align, share_weights=True)
        assert compact.layout == "shared" and compact.share_weights
        assert not [name for name, _ in compact.named_buffers()]  # no packed copy
        permuted = not torch.equal(mlp.gate_proj.weight, original["gate_proj.weight"])
        assert permuted == (compact.kept[compact.pruned] > 0)  # in place (nothing kept: the order is unchanged)
        assert_close_to_scale(compact(x, modality), expected)
        assert_close_to_scale(compact.forward_residual(x, residual, modality), residual + expected)
        for code, want in singles.items():
            assert_close_to_scale(compact(x, torch.full_like(modality, code)), want)
        assert_close_to_scale(compact(x[:, -1:], modality[:, -1:]), expected[:, -1:])
    # no token of the pruned modality (text-only decoding when vision is pruned): the dense MLP's matmuls, no more
    others = torch.full_like(modality, TEXT if compact.pruned == "vision" else VISION)
    with torch.no_grad(), CountMatmuls() as dense_count:
        want = mlp(x)
    with torch.no_grad(), CountMatmuls() as compact_count:
        assert torch.equal(compact(x, others), want)
    assert compact_count.count == dense_count.count
    with pytest.raises(RuntimeError, match="permuted"):
        mlp.state_dict()
    with pytest.raises(RuntimeError, match="permuted"):
        mlp.load_state_dict(original)
    compact.restore()
    compact.restore()  # idempotent
    assert all(torch.equal(t, original[name]) for name, t in mlp.state_dict().items())
    with pytest.raises(RuntimeError, match="restored: call share"):
        compact(x, modality)
    compact.share()
    with torch.no_grad():
        assert_close_to_scale(compact(x, modality), expected)


def test_padding_rows_are_zero_and_do_not_change_the_output():
    mlp = qwen2_mlp(bias=True)
    keep = random_keep(200, vision=0.3, seed=3)
    k = int(keep["vision"].sum())
    padded, tight = CompactModalityFFN(mlp, keep, align=64), CompactModalityFFN(mlp, keep, align=1)
    width = padded.width["vision"]
    assert tight.width["vision"] == k < width <= 200
    assert (padded.layout, padded.pruned) == ("shared", "vision")
    assert padded.kept_gate_up.shape == (2 * width, 48) and padded.kept_down.shape == (48, width)
    assert padded.rest_gate_up.shape == (2 * (200 - k), 48) and padded.rest_down.shape == (48, 200 - k)
    assert not padded.kept_gate_up[k:width].any() and not padded.kept_gate_up[width + k:].any()
    assert not padded.kept_down[:, k:].any() and not padded.kept_gate_up_bias[k:width].any()
    assert not padded.kept_gate_up_bias[width + k:].any()
    assert "kept_gate_up" not in padded.state_dict()  # packed copies are derived, not checkpointed
    assert set(padded.state_dict()) == {f"{n}_proj.{w}" for n in ("gate", "up", "down") for w in ("weight", "bias")}
    x, modality = random_inputs(48, seed=1)
    with torch.no_grad():
        assert_close_to_scale(padded(x, modality), tight(x, modality), rel=1e-6)
    grouped = CompactModalityFFN(mlp, random_keep(200, vision=0.3, text=0.5, seed=3), align=64)
    k = grouped.kept["text"]
    assert grouped.layout == "grouped" and grouped.text_down.shape == (48, grouped.width["text"])
    assert not grouped.text_down[:, k:].any() and not grouped.text_gate_up[k:grouped.width["text"]].any()


class CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm):
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("bias", [False, True])
def test_empty_visual_set_is_a_zero_update_without_matmul(bias):
    mlp = qwen2_mlp(bias=bias)
    keep = {"vision": torch.zeros(200, dtype=torch.bool), "text": torch.ones(200, dtype=torch.bool)}
    compact = CompactModalityFFN(mlp, keep)
    assert compact.layout == "shared" and compact.kept_down is None and compact.width["vision"] == 0
    x = torch.randn(1, 9, 48)
    vision = torch.full((1, 9), VISION, dtype=torch.int8)
    with torch.no_grad(), CountMatmuls() as counter:
        out = compact(x, vision)
    assert counter.count == 0
    expected = torch.zeros_like(out) if not bias else mlp.down_proj.bias.expand_as(out)
    assert torch.equal(out, expected)
    x, modality = random_inputs(48)
    with torch.no_grad():
        assert_close_to_scale(compact(x, modality), reference(mlp, x, modality, keep))


def test_bf16_follows_the_mask_mode_mlp():
    mlp = qwen2_mlp().to(torch.bfloat16)
    keep = random_keep(200, vision=0.5, text=0.8, seed=5)
    compact = CompactModalityFFN(mlp, keep)
    assert compact.vision_gate_up.dtype == torch.bfloat16
    x, modality = random_inputs(48, dtype=torch.bfloat16)
    with torch.no_grad():
        got = compact(x, modality)
        expected = reference(mlp.float(), x.float(), modality, keep)
    assert got.dtype == torch.bfloat16
    assert_close_to_scale(got.float(), expected, rel=2e-2)


def test_bad_arguments_are_named():
    mlp = qwen2_mlp()
    keep = random_keep(200)
    with pytest.raises(ValueError, match="align must be a positive integer, got 0"):
        CompactModalityFFN(mlp, keep, align=0)
    with pytest.raises(ValueError, match=r"got \['audio'\]"):
        CompactModalityFFN(mlp, {"audio": keep["vision"]})
    with pytest.raises(ValueError, match=r"keep\['vision'\] must be a bool tensor of shape \(200,\), got "
                                         r"torch.int64 \(200,\)"):
        CompactModalityFFN(mlp, {"vision": keep["vision"].long()})
    with pytest.raises(ValueError, match=r"shape \(200,\), got torch.bool \(100,\)"):
        CompactModalityFFN(mlp, {"vision": keep["vision"][:100]})
    with pytest.raises(TypeError, match="lacks"):
        CompactModalityFFN(nn.Linear(4, 4), keep)
    wrapped = copy.deepcopy(mlp)
    wrapped.down_proj = nn.Sequential(wrapped.down_proj)
    with pytest.raises(TypeError, match="down_proj is Sequential"):
        CompactModalityFFN(wrapped, keep)
    compact = CompactModalityFFN(mlp, keep)
    x, modality = random_inputs(48)
    with pytest.raises(ValueError, match=r"modality must be an int \[B, T\] = \(2, 57\)"):
        compact(x, modality[:, 1:])
    with pytest.raises(ValueError, match=r"residual \(2, 56, 48\) must match"):
        compact.forward_residual(x, x[:, 1:], modality)


def test_split_tokens_once_per_forward(monkeypatch):
    _, modality = random_inputs(8)
    split = split_tokens(modality)
    flat = modality.reshape(-1)
    for name, sel in (("vision", flat == VISION), ("text", flat == TEXT), ("other", (flat == SYSTEM) | (flat == PAD)),
                      ("not_vision", flat != VISION), ("not_text", flat != TEXT)):
        assert sorted(split[name].tolist()) == sel.nonzero().squeeze(1).tolist(), name
    compact = CompactModalityFFN(qwen2_mlp(d=8, m=16), random_keep(16))
    x = torch.randn(2, 57, 8)
    with pytest.raises(ValueError, match="split holds 114 tokens, the input 112"):
        compact(x[:, 1:], modality[:, 1:], split)
    model = dense_lm()
    plan, _ = _ffn_plan(model, seed=1)
    calls = []
    monkeypatch.setattr(swap_module, "split_tokens", lambda m: calls.append(m.shape) or split_tokens(m))
    ids = torch.randint(3, 100, (2, 12))
    ids[:, 2:6] = 120
    with torch.no_grad(), swap_compact_ffn(model, plan):
        model(input_ids=ids)
        model(input_ids=ids)
    assert calls == [(2, 12), (2, 12)]  # two forwards of two layers each: one split per forward


def _ffn_plan(model, seed=0, text=1.0):
    dense = WidthPlan.dense(model)
    gen = torch.Generator().manual_seed(seed)
    ffn = {}
    for layer, m in dense.intermediate_size.items():
        vision = torch.rand(m, generator=gen) < 0.5
        vision[layer] = False  # something pruned in every layer
        ffn[layer] = {"vision": vision, "text": torch.rand(m, generator=gen) < text}
    return dense.replace(ffn_keep=ffn), ffn


@pytest.mark.parametrize("family", TINY_DENSE_MLLMS)
def test_layer_outputs_equal_the_mask_width_mlp(tiny, family):
    """(b): every layer's compact FFN, fed the MLP's input under mask_width, gives that MLP's output."""
    model = tiny(family)
    batch = tiny_multimodal_batch(model, batch_size=3, seed=2)
    plan, ffn = _ffn_plan(model, seed=1, text=0.8)
    layers = find_width_layers(model)
    seen = {}
    handles = [l.mlp.register_forward_hook(lambda mod, args, out, i=l.index: seen.__setitem__(i, (args[0], out)))
               for l in layers]
    with torch.no_grad(), mask_width(model, plan):
        model(**batch)
    for h in handles:
        h.remove()
    modality = token_modality(batch["input_ids"], batch["attention_mask"], vision_token_ids(model))
    assert (modality == VISION).any() and (modality == TEXT).any() and (modality == PAD).any()
    for layer in layers:
        x, expected = seen[layer.index]
        compact = CompactModalityFFN(layer.mlp, ffn[layer.index], align=64)
        with torch.no_grad():
            assert_close_to_scale(compact(x, modality), expected)
            assert_close_to_scale(compact(x, modality), reference(layer.mlp, x, modality, ffn[layer.index]))


@pytest.mark.parametrize("family", TINY_DENSE_MLLMS)
def test_swapped_model_logits_equal_mask_width(tiny, family):
    model = tiny(family)
    batch = tiny_multimodal_batch(model, batch_size=3, seed=3)
    valid = batch["attention_mask"].bool()
    plan, _ = _ffn_plan(model, seed=2)
    with torch.no_grad():
        plain = model(**batch).logits
        with mask_width(model, plan):
            masked = model(**batch).logits
        assert (masked[valid] - plain[valid]).abs().max() > 1e-4  # the masks change the output
        with swap_compact_ffn(model, plan) as handle:
            assert sorted(handle.modules) == sorted(plan.ffn_keep)
            # the MLPs' own weights, permuted: no packed copy beside them, nothing saved in that order
            assert all(m.share_weights and not list(m.buffers()) for m in handle.modules.values())
            with pytest.raises(RuntimeError, match="remove the width kernels first"):
                model.state_dict()
            got = model(**batch).logits
        assert_close_to_scale(got[valid], masked[valid], rel=1e-6)
        assert torch.equal(model(**batch).logits, plain)  # remove() restores bitwise
        assert all("forward" not in vars(l.mlp) for l in find_width_layers(model))


def test_swap_with_attention_masks_and_dense_plan(tiny):
    model = tiny("qwen2_5_vl")
    batch = tiny_multimodal_batch(model, batch_size=2, seed=4)
    valid = batch["attention_mask"].bool()
    plan, _ = _ffn_plan(model, seed=3, text=0.7)
    gen = torch.Generator().manual_seed(0)
    plan = plan.replace(attn_keep={l: torch.rand(h, 3, generator=gen) < 0.6 for l, h in plan.num_heads.items()})
    with torch.no_grad():
        plain = model(**batch).logits
        with mask_width(model, plan):
            masked = model(**batch).logits
        with swap_compact_ffn(model, plan):  # attention masked as mask_width does, FFN compact
            assert_close_to_scale(model(**batch).logits[valid], masked[valid], rel=1e-6)
        with swap_compact_ffn(model, WidthPlan.dense(model)):
            assert_close_to_scale(model(**batch).logits[valid], plain[valid], rel=1e-6)
        handle = swap_compact_ffn(model, plan)
        with pytest.raises(RuntimeError, match="already active"):
            mask_width(model, plan)
        handle.remove()
        handle.remove()  # idempotent
        assert torch.equal(model(**batch).logits, plain)


def test_cached_decoding_and_peft_refusal():
    """A cached step after the prefill (new tokens are TEXT) equals mask mode; a LoRA-wrapped MLP is refused."""
    from peft import LoraConfig, get_peft_model
    model = dense_lm()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 100, (2, 14), generator=gen)
    ids[:, 3:9] = 120  # vision placeholders
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    plan, _ = _ffn_plan(model, seed=5)

    def two_steps():
        first = model(input_ids=ids, attention_mask=mask, use_cache=True)
        nxt = first.logits[:, -1].argmax(-1, keepdim=True)
        second = model(input_ids=nxt, attention_mask=torch.cat([mask, torch.ones_like(nxt)], 1),
                       past_key_values=first.past_key_values, use_cache=True)
        return first.logits, second.logits

    with torch.no_grad():
        with mask_width(model, plan):
            expected = two_steps()
        with swap_compact_ffn(model, plan):
            got = two_steps()
    for g, e in zip(got, expected):
        assert_close_to_scale(g[mask[:, -g.shape[1]:].bool()] if g.shape[1] > 1 else g,
                              e[mask[:, -e.shape[1]:].bool()] if e.shape[1] > 1 else e)
    wrapped = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, target_modules=["down_proj"]))
    with pytest.raises(TypeError, match="down_proj is .*merge a LoRA adapter"):
        swap_compact_ffn(wrapped, plan)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("text", [1.0, 0.8])
def test_cuda_bf16_and_fp32(text):
    """On the GPU: packed buffers follow the MLP's device; fp32 equals mask mode, bf16 stays near it."""
    mlp = qwen2_mlp(d=256, m=1024, seed=1).cuda()
    keep = random_keep(1024, vision=0.5, text=text, seed=2)
    x, modality = random_inputs(256, B=2, T=300, seed=3)
    x, modality = x.cuda(), modality.cuda()
    with torch.no_grad():
        expected = reference(mlp, x, modality, keep={mu: m.cuda() for mu, m in keep.items()})
        assert_close_to_scale(CompactModalityFFN(mlp, keep)(x, modality), expected, rel=1e-5)  # TF32 off
        half = CompactModalityFFN(mlp.to(torch.bfloat16), keep)
        assert next(iter(b for b in half.buffers() if b is not None)).device.type == "cuda"
        assert_close_to_scale(half(x.bfloat16(), modality).float(), expected, rel=3e-2)


@pytest.mark.exhaustive
def test_bench_prefill_quick_prints_ratios():
    """``bench_prefill.py --quick`` prints every CPU ratio; then, in the same process (Triton in interpreter mode,
    eager FlexAttention, tiny shapes), its GPU part prints every row it prints on a GPU, so the part a GPU session
    runs cannot rot unseen."""
    import importlib.util
    import re

    code = ("import sys, argparse, torch; sys.path.insert(0, 'scripts'); import bench_prefill as bp\n"
            "bp.main(['--quick', '--device', 'cpu'])\n"
            "print('--- GPU part on the CPU ---')\n"
            "args = argparse.Namespace(quick=True, repeats=1, warmup=0, align=16, threads=1)\n"
            "s7 = dict(d=64, heads=4, kv=2, head_dim=16, m=128, layers=1)\n"
            "bp.bench_gpu(args, torch.device('cpu'), s7, {'llava_onevision': (40, 8), 'qwen2_5_vl': (20, 6)})\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "TRITON_INTERPRET": "1"}, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    cpu, gpu = run.stdout.split("--- GPU part on the CPU ---")
    line = re.compile(r"^ratio (ffn|attention|total) +(llava_onevision|qwen2_5_vl) +pruned/dense median "
                      r"(\d+\.\d+) min (\d+\.\d+) +retained FLOPs (\d\.\d+)")
    found = {}
    for text in cpu.splitlines():
        match = line.match(text)
        if match:
            kind, point, median, low, fraction = match.groups()
            assert float(median) > 0 and float(low) > 0 and 0 < float(fraction) < 1, text
            found.setdefault(kind, set()).add(point)
    kinds = {"ffn", "total"} | ({"attention"} if importlib.util.find_spec("lightprune.width.kernels.path_attention") else set())
    assert set(found) == kinds and all(v == {"llava_onevision", "qwen2_5_vl"} for v in found.values()), cpu
    rows = re.findall(r"^ratio (ffn|attention) +(\w+) +pruned/dense median \d+\.\d+ .*?\[(\S+)", gpu, re.M)
    for point in ("llava_onevision", "qwen2_5_vl"):
        assert [(kind, note) for kind, p, note in rows if p == point] == [
            ("ffn", "visual"), ("ffn", "visual"), ("attention", "triton,"), ("attention", "path_sparse_attention"),
            ("attention", "sdpa:"), ("attention", "span:"), ("attention", "flex:")], gpu
    # the cost model's choice beside every candidate, judged on the GPU shapes (0.75 at LLaVA-OneVision's)
    chosen = re.compile(r"^chosen +attention (\w+) +(sdpa|span|flex) \(estimated sdpa [\d.]+ ms, span [\d.]+ ms, "
                        r"flex [\d.]+ ms\); measured pruned/dense sdpa [\d.]+, span [\d.]+, flex [\d.]+; fastest "
                        r"measured (sdpa|span|flex)(  target <= (\S+) +(PASS|FAIL))?$", re.M)
    assert {m.group(1): m.group(5) for m in chosen.finditer(cpu)} == dict.fromkeys(("llava_onevision", "qwen2_5_vl"))
    assert {m.group(1): m.group(5) for m in chosen.finditer(gpu)} == {"llava_onevision": "0.750",
                                                                      "qwen2_5_vl": "1.000"}, gpu
    assert "note: attention cost profile measured on cpu" in gpu
    assert len(re.findall(r"^chosen +attention \w+ +with the measured profile: (sdpa|span|flex) ", gpu, re.M)) == 2

"""Out-of-core paths against the in-memory ones, tensor by tensor: streamed weight scores, the meta skeleton run
layer by layer, checkpoints pruned shard by shard (uniform and non-uniform plans, sharded and single-file), their
verification, and what a failed or killed streaming export leaves behind."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from fixtures import assert_same_stats

import lightprune as lp
from lightprune.checkpoints import Checkpoint, Skeleton
from lightprune.checkpoints.sequential import layer_by_layer
from lightprune.export import MANIFEST_FILE, prune_checkpoint
from lightprune.export.verify import ExportVerificationError, default_probe, model_logits
from lightprune.models.layer import find_decoder_layers

FAMILIES = ["qwen3_moe", "mixtral", "deepseek_v3", "gemma4", "qwen3_vl_moe", "gpt_oss", "jamba", "granitemoe",
            "longcat_flash", "dbrx"]
#: also streamed: a vision tower whose checkpoint fuses q, k, v (Kimi K2.5: a split conversion), experts that read a
#: latent projection (Nemotron-H), a router weight stored transposed and a nested per-expert norm (Ergo), gate and up
#: stored as two fused tensors concatenated on load (Step 3.7), experts outside ExpertsInterface (Llama 4)
MORE_FAMILIES = ["kimi_k25", "nemotron_h", "ergo", "step3p7", "llama4_text"]


def saved(model, path: Path, sharded: bool) -> Path:
    model.save_pretrained(path, **({"max_shard_size": "20KB"} if sharded else {}))
    return path


def varied_plan(model) -> lp.ExpertPlan:
    """Half the experts of every MoE layer but the first, which keeps them all: a different count per layer."""
    plan = lp.select_experts(lp.score_weights(model, "random", seed=1), ratio=0.5, allocation="uniform")
    first = min(plan.keep)
    keep = {**plan.keep, first: list(range(plan.num_experts[first]))}
    plan = lp.ExpertPlan(keep=keep, num_experts=plan.num_experts, criterion="random", allocation="varied")
    assert len(set(plan.kept_counts().values())) > 1, plan.kept_counts()
    return plan


def state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("family", FAMILIES)
def test_streamed_weight_scores_equal_the_loaded_models(tiny, tmp_path, family):
    model = tiny(family, seed=2)
    path = saved(model, tmp_path / "ckpt", sharded=family in ("qwen3_moe", "deepseek_v3", "gemma4"))
    for criterion in ("aimer", "magnitude", "router_norm", "random"):
        expected = lp.score_weights(model, criterion, seed=3)
        got = lp.score_weights(path, criterion, seed=3, progress=False)
        assert got.raw.keys() == expected.raw.keys(), criterion
        for index in expected.raw:
            assert torch.equal(got.raw[index], expected.raw[index]), (criterion, index)
            assert torch.equal(got[index], expected[index]), (criterion, index)


@pytest.mark.parametrize("family", ["qwen3_moe", "gemma4", "gpt_oss"])
def test_a_streamed_weight_score_reads_only_the_tensors_its_criterion_reads(tiny, tmp_path, family, monkeypatch):
    """AIMER and magnitude read the experts' tensors (each once), router norm the router's weight, both with the other
    tensors the routing reads (checked finite before a layer is scored; each once), random nothing: the checkpoint
    keys read, recorded at the reader, against those the skeleton maps to those modules and tensors."""
    from lightprune.models import find_moe_layers

    path = saved(tiny(family, seed=2), tmp_path / "ckpt", sharded=True)
    with Checkpoint(path) as checkpoint:
        skeleton = Skeleton(checkpoint)
        names = {module: name for name, module in skeleton.model.named_modules()}
        layers = find_moe_layers(skeleton.model)

        def keys_under(modules):
            prefixes = tuple(f"{names[m]}." for m in modules)
            return sorted(key for target, keys in skeleton.sources.items() if target.startswith(prefixes)
                          for key in keys)
        experts = keys_under([layer.experts for layer in layers])
        router = keys_under([layer.router_linear for layer in layers])
        routing = {key for layer in layers for found in layer.family.routing_tensors(layer)
                   for key in skeleton.sources[found.name]}
        expected = {"aimer": sorted({*experts, *routing}), "router_norm": sorted({*router, *routing}), "random": []}
    expected["magnitude"] = expected["aimer"]
    assert experts and router and not set(experts) & set(router) and set(router) <= routing
    read: list[str] = []
    original = Checkpoint.read_into

    def recording(self, key, out, start=0):
        read.append(key)
        return original(self, key, out, start)
    monkeypatch.setattr(Checkpoint, "read_into", recording)
    for criterion, keys in expected.items():
        read.clear()
        lp.score_weights(path, criterion, seed=3, progress=False)
        assert sorted(read) == keys, criterion


def test_will_need_advises_exactly_the_keys_bytes_adjacent_ones_merged(tiny, tmp_path, monkeypatch):
    """The readahead advice covers each asked tensor's bytes in its file (from the header's offsets), adjacent
    tensors as one span, and nothing else; a streamed score asks, as each MoE layer is read, for the next layer's
    keys of its criterion, and no others."""
    import lightprune.checkpoints.reader as reader
    from lightprune.experts.criteria import get_criterion
    from lightprune.experts.criteria.scoring import streamed_layer_weights, weight_module_names
    from lightprune.models import find_moe_layers

    path = saved(tiny("qwen3_moe", seed=2), tmp_path / "ckpt", sharded=True)
    advised = []
    monkeypatch.setattr(reader.os, "posix_fadvise", lambda fd, offset, length, advice: advised.append(
        (os.readlink(f"/proc/self/fd/{fd}"), offset, length, advice)))
    with Checkpoint(path) as checkpoint:
        keys = [k for k in checkpoint.keys() if ".layers.1.mlp.experts." in k]
        by_file = {}
        for key in keys:
            file, info = checkpoint.entries()[key]
            begin, end = info["data_offsets"]
            by_file.setdefault(str(file), []).append((checkpoint._data_start[file] + begin,
                                                      checkpoint._data_start[file] + end))
        checkpoint.will_need(keys)
        checkpoint.close()  # waits for the advice thread
        expected = []
        for file, spans in by_file.items():
            merged = []
            for begin, end in sorted(spans):
                if merged and begin <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], end)
                else:
                    merged.append([begin, end])
            expected += [(file, b, e - b, os.POSIX_FADV_WILLNEED) for b, e in merged]
        assert sorted(advised) == sorted(expected) and len(advised) < len(keys)

    asked = []
    monkeypatch.setattr(Checkpoint, "will_need", lambda self, keys: asked.append(sorted(keys)))
    with Checkpoint(path) as checkpoint:
        skeleton = Skeleton(checkpoint)
        criterion = get_criterion("aimer")
        names = weight_module_names(skeleton, criterion)
        resident = streamed_layer_weights(skeleton, criterion)
        layers = find_moe_layers(skeleton.model)
        for layer in layers:
            with resident(layer):
                pass
        heads = lambda index: tuple(f"{n}." for n in names[index])
        assert asked == [sorted(k for t, ks in skeleton.sources.items() if t.startswith(heads(layer.index))
                                for k in ks) for layer in layers[1:]]


def test_without_a_readahead_thread_streaming_carries_on_and_says_so_once(tiny, tmp_path, monkeypatch):
    """A process that cannot start one more thread (a memory or thread limit) streams without readahead: the same
    scores and the same pruned checkpoint as with it, one warning for the whole process, and no advice issued."""
    import warnings

    import lightprune.checkpoints.reader as reader

    path = saved(tiny("qwen3_moe", seed=4), tmp_path / "ckpt", sharded=True)
    expected = lp.score_weights(path, "aimer", progress=False)
    plan = lp.select_experts(expected, ratio=0.5)
    lp.prune_checkpoint(path, plan, tmp_path / "with", progress=False)

    class NoThreads(reader.ThreadPoolExecutor):
        def submit(self, fn, *args, **kwargs):
            raise RuntimeError("can't start new thread")

    advised = []
    monkeypatch.setattr(reader, "ThreadPoolExecutor", NoThreads)
    monkeypatch.setattr(reader, "_readahead_said", False)
    monkeypatch.setattr(reader.os, "posix_fadvise", lambda *args: advised.append(args))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = lp.score_weights(path, "aimer", progress=False)
        lp.prune_checkpoint(path, plan, tmp_path / "without", progress=False)
    said = [w for w in caught if "readahead" in str(w.message)]
    assert len(said) == 1 and "can't start new thread" in str(said[0].message), [str(w.message) for w in caught]
    assert advised == []
    assert got.keys() == expected.keys() and all(torch.equal(got[i], expected[i]) for i in expected)
    with_files = {f.name: f.read_bytes() for f in (tmp_path / "with").glob("*.safetensors")}
    assert with_files and with_files == {f.name: f.read_bytes() for f in (tmp_path / "without").glob("*.safetensors")}


def test_a_released_layer_is_read_into_again_only_when_nothing_else_holds_it(tiny, tmp_path):
    """With a pool (streamed scores), the next layer of the same shapes is read into the released layer's storages
    (no new memory), except one a caller still holds (by name or through a view), whose values stay as they were;
    without a pool nothing is kept after a release."""
    from lightprune.checkpoints.pool import ReadPool

    model = tiny("qwen3_moe", seed=2)
    path = saved(model, tmp_path / "ckpt", sharded=True)
    expected = state(model)
    with Checkpoint(path) as checkpoint:
        plain = Skeleton(checkpoint)
        assert plain.pool is None
        skeleton = Skeleton(checkpoint, pool=ReadPool())
        first, second, third = (f"model.layers.{i}.mlp.experts" for i in range(3))
        skeleton.load([first])
        storages = {n: p.untyped_storage().data_ptr()
                    for n, p in skeleton.model.get_submodule(first).named_parameters()}
        skeleton.release([first])
        assert len(skeleton.pool) == len(storages)
        skeleton.load([second])
        assert len(skeleton.pool) == 0
        experts = skeleton.model.get_submodule(second)
        assert {n: p.untyped_storage().data_ptr() for n, p in experts.named_parameters()} == storages
        for name, p in experts.named_parameters():
            assert torch.equal(p, expected[f"{second}.{name}"]), name
        held, view = experts.gate_up_proj, experts.down_proj[0]
        before = held.clone(), view.clone()
        skeleton.release([second])
        assert len(skeleton.pool) == 0
        skeleton.load([third])
        now = skeleton.model.get_submodule(third)
        assert now.gate_up_proj.untyped_storage().data_ptr() != held.untyped_storage().data_ptr()
        assert now.down_proj.untyped_storage().data_ptr() != view.untyped_storage().data_ptr()
        assert torch.equal(held, before[0]) and torch.equal(view, before[1])
        for name, p in now.named_parameters():
            assert torch.equal(p, expected[f"{third}.{name}"]), name


def test_a_shared_pool_reads_a_smaller_layer_into_a_larger_ones_storages_and_back(tiny, tmp_path):
    """Two skeletons sharing a pool (verification: the source, then its pruned copy): the pruned layer's tensors
    are read into the storages the source layer released, largest tensor into the smallest storage that holds it,
    and the next source layer into the same storages again; every value is the checkpoint's."""
    from lightprune.checkpoints.pool import ReadPool

    model = tiny("qwen3_moe", seed=2)
    path = saved(model, tmp_path / "ckpt", sharded=True)
    plan = lp.select_experts(lp.score_weights(model, "aimer"), ratio=0.5)
    out = prune_checkpoint(path, plan, tmp_path / "out", verify=False, progress=False).path
    pruned_state = state(lp.load_pruned(out))
    pool = ReadPool()
    source, pruned = Skeleton(Checkpoint(path), pool=pool), Skeleton(Checkpoint(out), pool=pool)
    name = lambda i: f"model.layers.{i}.mlp.experts"
    ptrs = lambda skeleton, i: {p.untyped_storage().data_ptr()
                                for p in skeleton.model.get_submodule(name(i)).parameters()}

    def assert_values(skeleton, i, expected):  # in a function: a loop variable left holding a tensor would keep it
        for n, p in skeleton.model.get_submodule(name(i)).named_parameters():
            assert torch.equal(p, expected[f"{name(i)}.{n}"]), n

    source.load([name(0)])
    first = ptrs(source, 0)
    source.release([name(0)])
    pruned.load([name(0)])
    assert ptrs(pruned, 0) == first
    assert_values(pruned, 0, pruned_state)
    pruned.release([name(0)])
    source.load([name(1)])
    assert ptrs(source, 1) == first
    assert_values(source, 1, state(model))


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3", "gemma4", "qwen3_vl_moe", "jamba"])
def test_the_skeleton_run_layer_by_layer_gives_the_loaded_models_logits(tiny, tmp_path, family):
    model = tiny(family, seed=2).eval()
    path = saved(model, tmp_path / "ckpt", sharded=True)
    probe = default_probe(model)
    skeleton = Skeleton(Checkpoint(path))
    seen = []
    _, layers = find_decoder_layers(skeleton.model)
    for layer in layers:  # at most one decoder layer in memory while it runs
        layer.register_forward_pre_hook(lambda *_: seen.append(sum(
            any(p.device.type != "meta" for p in other.parameters()) for other in layers)))
    with layer_by_layer(skeleton):
        logits = model_logits(skeleton.model, probe, device="cpu")
    assert torch.equal(logits, model_logits(model, probe))
    assert seen and max(seen) == 0, seen  # the pre-hooks run before the layer's own load hook
    assert all(p.device.type == "meta" for p in skeleton.model.parameters())  # all released after


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_vl_moe"])
def test_two_skeletons_run_in_lockstep_give_each_models_logits_one_layer_resident(tiny, tmp_path, family):
    """Two checkpoints (a model and another seed's) run in step: each forward's logits are its loaded model's, and
    at every (decoder layer, skeleton)'s ``after``, in that order, exactly that layer of that skeleton is
    resident."""
    from lightprune.checkpoints.sequential import run_in_lockstep

    models = [tiny(family, seed=seed).eval() for seed in (2, 3)]
    skeletons = [Skeleton(Checkpoint(saved(m, tmp_path / f"ckpt{i}", sharded=True))) for i, m in enumerate(models)]
    probe = default_probe(models[0])
    logits, resident = {}, []
    layers = [find_decoder_layers(s.model)[1] for s in skeletons]

    def after(index, skeleton):
        resident.append((index, skeletons.index(skeleton), [
            [i for i, layer in enumerate(found) if all(p.device.type != "meta" for p in layer.parameters())]
            for found in layers]))

    def run(i):
        logits[i] = model_logits(skeletons[i].model, probe, device="cpu")
    run_in_lockstep([(skeletons[0], lambda: run(0)), (skeletons[1], lambda: run(1))], after=after)
    for i, model in enumerate(models):
        assert torch.equal(logits[i], model_logits(model, probe)), i
    assert resident == [(index, s, [[index] if s == 0 else [], [index] if s == 1 else []])
                        for index in range(len(layers[0])) for s in (0, 1)]
    assert all(p.device.type == "meta" for s in skeletons for p in s.model.parameters())


def test_lockstep_refuses_models_of_different_depths(tiny, tmp_path):
    from lightprune.checkpoints.sequential import run_in_lockstep

    shallow = Skeleton(Checkpoint(saved(tiny("qwen3_moe", seed=2, num_hidden_layers=2), tmp_path / "a", False)))
    deep = Skeleton(Checkpoint(saved(tiny("qwen3_moe", seed=2, num_hidden_layers=3), tmp_path / "b", False)))
    with pytest.raises(ValueError, match=r"\[2, 3\] decoder layers"):
        run_in_lockstep([(shallow, lambda: None), (deep, lambda: None)])


def test_verification_reads_every_tensor_of_both_checkpoints_once(tiny, tmp_path, monkeypatch):
    """The masked source and the pruned checkpoint run in one pass, each layer's check as its layers are resident:
    every checkpoint key either model is built from is read exactly once (recorded at the reader)."""
    from collections import Counter

    from lightprune.export.streamed_verify import verify_pruned_checkpoint

    model = tiny("qwen3_moe", seed=2)
    path = saved(model, tmp_path / "ckpt", sharded=True)
    plan = lp.select_experts(lp.score_weights(model, "aimer"), ratio=0.5)
    out = prune_checkpoint(path, plan, tmp_path / "out", verify=False, progress=False).path
    expected = Counter()
    for where in (path, out):
        sources = Skeleton(Checkpoint(where)).sources
        expected.update((str(where), key) for key in {key for keys in sources.values() for key in keys})
    read = Counter()
    original, tensor = Checkpoint.read_into, Checkpoint.tensor

    def recording(self, key, out, start=0):
        read[(str(self.path), key)] += 1
        return original(self, key, out, start)

    def recording_tensor(self, key, dtype=None):
        read[(str(self.path), key)] += 1
        return tensor(self, key, dtype)
    monkeypatch.setattr(Checkpoint, "read_into", recording)
    monkeypatch.setattr(Checkpoint, "tensor", recording_tensor)
    with Checkpoint(path) as source:
        found = verify_pruned_checkpoint(source, plan, out, progress=False)
    assert set(found["blocks"]) == {str(i) for i in plan.keep}
    assert read == expected


def test_a_skeleton_refuses_a_checkpoint_missing_a_tensor_before_any_read(tiny, tmp_path):
    from safetensors.torch import load_file, save_file

    model = tiny("qwen3_moe", seed=2)
    path = saved(model, tmp_path / "ckpt", sharded=False)
    tensors = load_file(path / "model.safetensors")
    dropped = "model.layers.1.mlp.experts.3.down_proj.weight"
    assert dropped in tensors
    del tensors[dropped]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f"lacks 1 tensor of experts whose other tensors it has \\({dropped}\\)"):
        Skeleton(Checkpoint(path))


@pytest.mark.parametrize("family, kind", [(f, k) for f in FAMILIES for k in ("uniform", "varied")] +
                         [(f, "uniform") for f in MORE_FAMILIES])
def test_a_checkpoint_pruned_shard_by_shard_equals_the_pruned_model(tiny, tmp_path, family, kind):
    model = tiny(family, seed=2).eval()
    sharded = kind == "varied" or family in ("mixtral", "gemma4")
    path = saved(model, tmp_path / "ckpt", sharded=sharded)
    plan = varied_plan(model) if kind == "varied" else \
        lp.select_experts(lp.score_weights(model, "aimer"), ratio=0.5, allocation="uniform")
    out = prune_checkpoint(path, plan, tmp_path / "out", progress=False).path
    expected = lp.prune_experts(copy.deepcopy(model), plan)
    reloaded = lp.load_pruned(out)
    want, got = state(expected), state(reloaded)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["uniform"] == (kind == "uniform")
    assert manifest["experts_per_layer"] == {str(k): v for k, v in plan.kept_counts().items()}
    assert manifest["verification"]["max_abs_diff"] <= manifest["verification"]["atol"]
    assert set(manifest["verification"]["blocks"]) == {str(i) for i in plan.keep}
    assert (out / "model.safetensors.index.json").is_file() == sharded
    if kind == "uniform":  # plain transformers loads it
        from lightprune.checkpoints.classes import auto_class

        plain = auto_class(reloaded.config).from_pretrained(out)
        assert all(torch.equal(v, want[k]) for k, v in state(plain).items())


def test_tokenizer_and_generation_files_come_along(tiny, tmp_path):
    from lightprune.data import train_bpe_tokenizer

    model = tiny("qwen3_moe", seed=2)
    path = saved(model, tmp_path / "ckpt", sharded=False)
    tokenizer = train_bpe_tokenizer(["a tiny sentence to tokenize", "and another one"] * 4, vocab_size=64)
    tokenizer.save_pretrained(path)
    (path / "generation_config.json").write_text(json.dumps({"max_new_tokens": 7}))
    plan = lp.select_experts(lp.score_weights(model, "aimer"), ratio=0.5)
    out = prune_checkpoint(path, plan, tmp_path / "out", progress=False).path
    from transformers import AutoTokenizer

    text = "a tiny sentence"
    assert AutoTokenizer.from_pretrained(out)(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert json.loads((out / "generation_config.json").read_text()) == {"max_new_tokens": 7}
    assert json.loads((out / MANIFEST_FILE).read_text())["tokenizer"]["origin"] == "source_dir"


def test_a_wrong_write_fails_verification_and_leaves_the_previous_output(tiny, tmp_path, monkeypatch):
    """Two kept experts written under each other's index: the layer check names the layer, nothing changes."""
    import lightprune.export.streamed as streamed

    model = tiny("qwen3_moe", seed=2)
    path = saved(model, tmp_path / "ckpt", sharded=True)
    plan = lp.select_experts(lp.score_weights(model, "aimer"), ratio=0.5)
    out = prune_checkpoint(path, plan, tmp_path / "out", progress=False).path
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    rules = streamed.key_rules

    def swapped(*args):
        found = rules(*args)
        for key, rule in found.items():
            if rule.out_key and ".layers.1.mlp.experts." in rule.out_key and ".experts.0." in rule.out_key:
                found[key] = streamed.KeyRule(rule.out_key.replace(".experts.0.", ".experts.1."))
            elif rule.out_key and ".layers.1.mlp.experts." in rule.out_key and ".experts.1." in rule.out_key:
                found[key] = streamed.KeyRule(rule.out_key.replace(".experts.1.", ".experts.0."))
        return found

    monkeypatch.setattr(streamed, "key_rules", swapped)
    with pytest.raises(ExportVerificationError, match="layer 1"):
        prune_checkpoint(path, plan, tmp_path / "out", overwrite=True, progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_two_kept_experts_no_probe_token_reaches_swapped_fail_verification(tiny, tmp_path, monkeypatch):
    """Every kept expert is checked, not only those the probe's tokens route to: a probe of one token per row
    reaches at most 4 of the 8 kept experts of a layer; two kept experts it never selects, written under each
    other's index, pass the routed-output check and the logits (the probe cannot see them) and fail the forced
    selection of every kept expert, which names the layer."""
    import lightprune.export.streamed as streamed
    from lightprune.models import find_moe_layers

    model = tiny("qwen3_moe", seed=2, num_experts=16)
    path = saved(model, tmp_path / "ckpt", sharded=True)
    plan = lp.select_experts(lp.score_weights(model, "aimer"), ratio=0.5)
    probe = default_probe(model, shape=(2, 1), seed=0)
    layer = find_moe_layers(model)[1]
    selected = []
    layer.router.register_forward_hook(lambda module, args, output: selected.append(output[2]))
    with lp.mask_experts(model, plan):
        model_logits(model, probe)
    unreached = sorted(set(plan.keep[1]) - set(torch.cat(selected).flatten().tolist()))
    assert len(unreached) >= 2, unreached
    a, b = (sorted(plan.keep[1]).index(e) for e in unreached[:2])  # their positions in the pruned layer
    rules = streamed.key_rules

    def swapped(*args):
        found = rules(*args)
        for key, rule in found.items():
            if rule.out_key and ".layers.1.mlp.experts." in rule.out_key:
                for old, new in ((f".experts.{a}.", f".experts.{b}."), (f".experts.{b}.", f".experts.{a}.")):
                    if old in rule.out_key:
                        found[key] = streamed.KeyRule(rule.out_key.replace(old, new))
                        break
        return found

    monkeypatch.setattr(streamed, "key_rules", swapped)
    with pytest.raises(ExportVerificationError, match="layer 1 .*kept experts' outputs under a forced selection"):
        prune_checkpoint(path, plan, tmp_path / "out", progress=False, probe_tokens=1)
    assert not (tmp_path / "out").exists()


@pytest.mark.exhaustive
def test_a_killed_streaming_export_leaves_the_previous_output(tiny, tmp_path):
    model = tiny("qwen3_moe", seed=2)
    path = saved(model, tmp_path / "ckpt", sharded=True)
    plan = lp.select_experts(lp.score_weights(model, "aimer"), ratio=0.5)
    plan.save(tmp_path / "plan.json")
    out = prune_checkpoint(path, plan, tmp_path / "out", progress=False).path
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    script = textwrap.dedent(f"""
        import os, signal
        import lightprune as lp
        from lightprune.checkpoints import writer
        written = []
        def killing(original):  # a tensor's bytes written, or copied from the source by the kernel
            def wrote(self, name, *args):
                original(self, name, *args)
                written.append(name)
                if len(written) == 5:  # in the middle of the shards
                    os.kill(os.getpid(), signal.SIGKILL)
            return wrote
        writer.SafetensorsWriter.write = killing(writer.SafetensorsWriter.write)
        writer.SafetensorsWriter.copy = killing(writer.SafetensorsWriter.copy)
        plan = lp.ExpertPlan.load({str(tmp_path / 'plan.json')!r})
        lp.prune_checkpoint({str(path)!r}, plan, {str(tmp_path / 'out')!r}, overwrite=True, progress=False)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert any(p.name.startswith(".out") for p in tmp_path.iterdir())  # the killed run's staging directory
    prune_checkpoint(path, plan, tmp_path / "out", overwrite=True, progress=False)  # cleans it up
    assert not any(p.name.startswith(".out") for p in tmp_path.iterdir())


def test_prune_checkpoint_refuses_its_own_source_and_a_plan_of_another_model(tiny, tmp_path):
    model = tiny("qwen3_moe", seed=2)
    path = saved(model, tmp_path / "ckpt", sharded=False)
    plan = lp.select_experts(lp.score_weights(model, "aimer"), ratio=0.5)
    with pytest.raises(ValueError, match="source checkpoint"):
        prune_checkpoint(path, plan, path, overwrite=True, progress=False)
    other = lp.ExpertPlan(keep={0: [0, 1, 2, 3]}, num_experts={0: 16})  # the layer has 8 experts
    with pytest.raises(lp.PlanError, match="16"):
        prune_checkpoint(path, other, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


_UNDER_LIMIT = """
import resource, sys
import torch
import lightprune as lp
from lightprune.checkpoints import Checkpoint, Skeleton
path, out, budget, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
Skeleton(Checkpoint(path))  # imports and lazy modules in place before the limit
data = int([l for l in open("/proc/self/status") if l.startswith("VmData")][0].split()[1]) * 1024
# verification runs the source's and the pruned model's forwards in two threads, whose stacks (reserved, mostly
# untouched: RLIMIT_STACK each, as glibc sizes a thread's stack) the limit counts as data
# (and the readahead's thread: without it, reading carries on without readahead)
stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
stacks = 3 * (stack if 0 < stack < 1 << 30 else 8 << 20)
resource.setrlimit(resource.RLIMIT_DATA, (data + budget + stacks, resource.RLIM_INFINITY))
try:
    if mode == "stream":
        scores = lp.score_weights(path, "aimer", progress=False)
        plan = lp.select_experts(scores, ratio=0.5)
        lp.prune_checkpoint(path, plan, out, progress=False, atol=1e-4)  # fp32 reordering over 8 layers
    else:
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(path)
except MemoryError:
    sys.exit(3)
"""


@pytest.mark.exhaustive
def test_streaming_runs_under_a_memory_limit_smaller_than_the_checkpoint(tmp_path):
    """A private-memory limit (RLIMIT_DATA over what the process holds once imported) of a third of the
    checkpoint, plus the stacks of the verification forwards' and the readahead's threads: scoring and pruning
    (with verification) stream within it, loading the model does not. glibc is told to map every allocation over 128 KiB on its own
    (MALLOC_MMAP_THRESHOLD_), so that freed memory leaves the data segment and the limit counts live memory, not
    the heap's high-water mark."""

    from lightprune.testing.tiny import tiny_model

    # 16 layers: a third of the checkpoint is about twice what one layer's verification holds (the source layer,
    # the pruned one, and the experts kernel's copies of a layer's weights)
    config = dict(hidden_size=256, moe_intermediate_size=256, num_experts=32, num_hidden_layers=16,
                  vocab_size=256, intermediate_size=256)
    model = tiny_model("qwen3_moe", seed=0, **config)
    path = saved(model, tmp_path / "ckpt", sharded=True)
    size = Checkpoint(path).total_bytes
    assert size > 300e6, size
    budget = size // 3
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DEACTIVATE_ASYNC_LOAD": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}
    run = lambda mode: subprocess.run(  # noqa: E731
        [sys.executable, "-c", _UNDER_LIMIT, str(path), str(tmp_path / mode), str(budget), mode],
        capture_output=True, text=True, timeout=600, env=env)
    streamed = run("stream")
    assert streamed.returncode == 0, streamed.stderr[-3000:]
    assert lp.load_pruned(tmp_path / "stream") is not None
    loaded = run("load")
    assert loaded.returncode != 0, "the limit is not binding: the whole model loaded under it"


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3", "mixtral", "jamba", "llama4_text",
                                    "inkling2_loop_text", "longcat_flash", "dbrx"])
def test_sequential_calibration_equals_the_in_memory_pass(tiny, tmp_path, family):
    """Every criterion (delta_h_promoted too) for two subsets, bit for bit, with passes of 2 batches over 3 (each
    layer read twice), padded batches included. Llama 4 is observed in its own MoE block; Inkling 2 Loop runs its
    last two layers twice per forward, so the pass visits them twice."""
    from lightprune.experts.calibration import CRITERIA
    from lightprune.testing.batches import tiny_text_batch

    model = tiny(family, seed=2).eval()
    path = saved(model, tmp_path / "ckpt", sharded=True)
    batches = [tiny_text_batch(model, batch_size=2, seq_len=10, seed=s, pad=s != 1) for s in range(3)]
    kwargs = dict(subsets=("all", "text"), criteria=CRITERIA, progress=False)
    expected = lp.collect_expert_stats(model, batches, **kwargs)
    got = lp.collect_expert_stats(path, batches, batches_per_pass=2, **kwargs)
    assert got.metadata["batches"] == expected.metadata["batches"] == 3
    assert_same_stats(got, expected)


@pytest.mark.parametrize("family", ["qwen3_vl_moe", "gemma4", "internvl"])
def test_sequential_calibration_of_an_mllm_with_the_attention_probe(tiny, tmp_path, family):
    """Vision subsets, the low- and high-attention ones from the attention probe too, equal the in-memory pass;
    Qwen3-VL adds its deepstack features between decoder layers, which the model's own forward does here."""
    from lightprune.testing.batches import tiny_multimodal_batch

    model = tiny(family, seed=2).eval()
    path = saved(model, tmp_path / "ckpt", sharded=True)
    batches = [tiny_multimodal_batch(model, seed=s) for s in (3, 4)]
    kwargs = dict(subsets=("all", "text", "vision", "vision_low_attn", "vision_high_attn"), progress=False)
    expected = lp.collect_expert_stats(model, batches, **kwargs)
    got = lp.collect_expert_stats(path, batches, **kwargs)
    assert_same_stats(got, expected)


def test_a_forward_that_fails_stops_the_sequential_run_and_says_where(tiny, tmp_path):
    model = tiny("qwen3_moe", seed=2)
    path = saved(model, tmp_path / "ckpt", sharded=False)
    good = {"input_ids": torch.tensor([[3, 4, 5, 6]])}
    bad = {"input_ids": torch.tensor([[3, 4, 5, 10**6]])}  # an id past the vocabulary
    with pytest.raises(IndexError):
        lp.collect_expert_stats(path, [good, bad], progress=False)
    with pytest.raises(TypeError, match="batches_per_pass"):
        lp.collect_expert_stats(model, [good], batches_per_pass=2, progress=False)


def test_calibration_of_an_offloaded_model_is_refused_before_any_batch(tiny, tmp_path):
    """accelerate's disk offload (device_map="auto" under a max_memory smaller than the model): the observers would
    read meta weights; refused, naming the layers and the streamed alternative, before the first batch runs."""
    from lightprune.finetune import MoECausalLM

    model = tiny("qwen3_moe", seed=2)
    path = saved(model, tmp_path / "ckpt", sharded=False)
    module = MoECausalLM(checkpoint=str(path), device_map="auto", max_memory={"cpu": "30KB"},
                         offload_folder=str(tmp_path / "offload"))
    module.configure_model()
    assert any(getattr(getattr(m, "_hf_hook", None), "offload", False) for m in module.model.modules())
    calls = []

    def batches():
        calls.append(1)
        yield {"input_ids": torch.tensor([[3, 4, 5]])}

    with pytest.raises(ValueError, match=r"offloads \(model.layers.0.mlp.*collect_expert_stats\(checkpoint_dir"):
        lp.collect_expert_stats(module.model, batches(), progress=False)
    assert calls == []
    with pytest.raises(ValueError, match="apply to checkpoint="):
        MoECausalLM(tiny="qwen3_moe", device_map="cpu")


def test_a_sequential_module_streams_its_checkpoint_and_refuses_what_needs_it_in_memory(tiny, tmp_path):
    from lightprune.finetune import AdapterSpec, MoECausalLM

    model = tiny("qwen3_moe", seed=2).eval()
    path = saved(model, tmp_path / "ckpt", sharded=True)
    module = MoECausalLM(checkpoint=str(path), sequential=True)
    module.configure_model()
    assert list(module.parameters()) == []  # the skeleton is not a submodule: Lightning never moves it
    assert all(p.device.type == "meta" for p in module.model.parameters())
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        logits = module(input_ids=ids).logits
        assert torch.equal(logits, model(input_ids=ids).logits)
    assert all(p.device.type == "meta" for p in module.model.parameters())
    with pytest.raises(ValueError, match="does not train"):
        module.configure_optimizers()
    for bad in (dict(tiny="qwen3_moe"), dict(checkpoint=str(path), adapter=AdapterSpec(kind="lora")),
                dict(checkpoint=str(path), device_map="cpu")):
        with pytest.raises(ValueError, match="sequential=True"):
            MoECausalLM(**bad, sequential=True)
    with pytest.raises(ValueError, match="batches_per_pass must be an int >= 1, got 0"):
        MoECausalLM(checkpoint=str(path), sequential=True, batches_per_pass=0)


def test_lightning_calibration_of_a_sequential_module_runs_passes_that_end_at_every_state_save(tiny, tmp_path,
                                                                                              monkeypatch):
    """PruneTrainer.calibrate with MoECausalLM(sequential=True) and ExpertStats saving its state every 2 batches:
    the deferred forwards run before each save (the saved state holds every batch it counted) and at the end; the
    statistics equal an in-memory calibration's."""
    from lightprune.callbacks import ExpertStats
    from lightprune.cli.trainer import PruneTrainer
    from lightprune.data import SyntheticTokens
    from lightprune.finetune import MoECausalLM

    model = tiny("qwen3_moe", seed=2)
    path = saved(model, tmp_path / "ckpt", sharded=True)
    passes, saved_counts = [], []
    flush = MoECausalLM.flush_deferred
    monkeypatch.setattr(MoECausalLM, "flush_deferred",
                        lambda self, before=None: (passes.append(len(self._deferred)), flush(self, before))[1])
    save = ExpertStats._save_state
    monkeypatch.setattr(ExpertStats, "_save_state", lambda self, trainer: (
        saved_counts.append(int(self._observer.statistics[min(self._observer.statistics)].counts.tokens(0))),
        save(self, trainer))[1])
    stats = {}
    for mode in ("memory", "sequential"):
        callback = ExpertStats(subsets=["all", "text"], save_every_n_batches=2, output_dir=str(tmp_path / mode))
        trainer = PruneTrainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                               enable_progress_bar=False, enable_model_summary=False,
                               default_root_dir=str(tmp_path / mode), callbacks=[callback])
        trainer.calibrate(MoECausalLM(checkpoint=str(path), sequential=mode == "sequential"),
                          datamodule=SyntheticTokens(num_samples=10, seq_len=8, batch_size=2, seed=3))
        stats[mode] = callback.stats
    assert [n for n in passes if n] == [2, 2, 1]  # the sequential run (the in-memory one defers nothing)
    assert saved_counts[2:] == saved_counts[:2] == [32, 64]  # 2 and 4 batches of 2 x 8 tokens, in both runs
    assert_same_stats(stats["sequential"], stats["memory"])

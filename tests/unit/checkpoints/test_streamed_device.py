"""The streamed paths' ``device``: checked before anything is read, the same results on the CPU named explicitly,
hidden states moved off the device beyond the activation budget without changing a statistic, and on a GPU (when
there is one) the streamed pass equal to the in-memory one on that GPU, without a host sync."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fixtures import assert_same_stats

import lightprune as lp
from lightprune.checkpoints import Checkpoint, Skeleton
from lightprune.checkpoints.device import streaming_device
from lightprune.checkpoints.sequential import BoundaryActivations, run_layer_outer
from lightprune.models.layer import find_decoder_layers
from lightprune.testing.batches import tiny_text_batch


def saved(model, path: Path) -> Path:
    model.save_pretrained(path, max_shard_size="20KB")
    return path


@pytest.mark.parametrize("device, error, said", [
    ("gpu", ValueError, "'gpu' is not a device"),
    ("meta", ValueError, "not on 'meta'"),
    (True, TypeError, "True"),
    (1.5, TypeError, "1.5"),
] + ([] if torch.cuda.is_available() else [("cuda", ValueError, "sees no CUDA device"),
                                              ("cuda:1", ValueError, "'cuda:1'")]))
def test_a_device_that_cannot_run_is_refused_naming_it_before_any_read(tiny, tmp_path, device, error, said,
                                                                         monkeypatch):
    path = saved(tiny("qwen3_moe"), tmp_path / "ckpt")
    reads = []
    monkeypatch.setattr(Checkpoint, "read_into", lambda self, *a, **k: reads.append(a))
    batch = {"input_ids": torch.tensor([[3, 4, 5]])}
    for call in (lambda: lp.score_weights(path, "aimer", progress=False, device=device),
                 lambda: lp.collect_expert_stats(path, [batch], progress=False, device=device),
                 lambda: lp.prune_checkpoint(path, lp.select_experts(lp.score_weights(tiny("qwen3_moe"), "aimer"),
                                                                     0.5), tmp_path / "out", device=device)):
        with pytest.raises(error, match=said.replace("(", r"\(").replace(")", r"\)")):
            call()
    assert not reads and not (tmp_path / "out").exists()


def test_cpu_names_the_cpu_and_a_model_in_memory_refuses_a_device(tiny):
    assert streaming_device("cpu") == streaming_device(torch.device("cpu:0")) == torch.device("cpu")
    with pytest.raises(TypeError, match="model in memory is scored where it is"):
        lp.score_weights(tiny("qwen3_moe"), "aimer", device="cpu")


def test_the_cpu_named_gives_the_default_paths_results(tiny, tmp_path):
    model = tiny("qwen3_moe", seed=3).eval()
    path = saved(model, tmp_path / "ckpt")
    assert lp.score_weights(path, "aimer", progress=False, device="cpu").to_json() == \
        lp.score_weights(path, "aimer", progress=False).to_json()
    batches = [tiny_text_batch(model, batch_size=2, seq_len=8, seed=s) for s in range(2)]
    got = lp.collect_expert_stats(path, batches, progress=False, device=torch.device("cpu"))
    assert_same_stats(got, lp.collect_expert_stats(path, batches, progress=False))
    assert got.metadata["device"] == "cpu"


@pytest.mark.parametrize("family", ["qwen3_moe", "inkling2_loop_text"])
def test_hidden_states_beyond_the_budget_leave_the_device_and_change_no_statistic(tiny, tmp_path, family):
    """Budget 0: every forward waiting at a decoder layer has its hidden states moved out (on the CPU to another
    host tensor) and back at its turn: one move per batch and layer visit (Inkling 2 Loop visits two layers twice),
    and every statistic equals the in-memory pass's bit for bit. With no bound nothing moves and the report holds the
    largest set of hidden states waiting at once: all the pass's batches."""
    from lightprune.experts.calibration import CRITERIA

    model = tiny(family, seed=2).eval()
    path = saved(model, tmp_path / "ckpt")
    batches = [tiny_text_batch(model, batch_size=2, seq_len=10, seed=s, pad=s == 0) for s in range(3)]
    kwargs = dict(subsets=("all", "text"), criteria=CRITERIA, progress=False)
    expected = lp.collect_expert_stats(model, batches, **kwargs)
    spilled = lp.collect_expert_stats(path, batches, activation_budget=0, **kwargs)
    assert_same_stats(spilled, expected)
    visits = []
    handles = [layer.register_forward_pre_hook(lambda *a: visits.append(1)) for layer in find_decoder_layers(model)[1]]
    with torch.no_grad():
        model(**tiny_text_batch(model, batch_size=2, seq_len=10, seed=0))
    for handle in handles:
        handle.remove()
    width = model.config.hidden_size * torch.finfo(model.dtype).bits // 8
    report = spilled.metadata["activations"]
    assert report["spills"] == len(batches) * len(visits)
    assert report["spilled_bytes"] == len(batches) * len(visits) * 2 * 10 * width
    assert report["peak_bytes"] == 0 and report["budget_bytes"] == 0
    kept = lp.collect_expert_stats(path, batches, activation_budget=None, **kwargs)
    assert_same_stats(kept, expected)
    assert kept.metadata["activations"] == {"budget_bytes": None, "peak_bytes": len(batches) * 2 * 10 * width,
                                            "spills": 0, "spilled_bytes": 0}


def test_a_budget_keeps_the_first_arrivals_and_moves_the_rest(tiny, tmp_path):
    """A budget of two batches' hidden states: at every layer the first two forwards to arrive stay, the third
    moves; the logits are the loaded model's."""
    model = tiny("qwen3_moe", seed=1).eval()
    path = saved(model, tmp_path / "ckpt")
    batches = [tiny_text_batch(model, batch_size=1, seq_len=6, seed=s) for s in range(3)]
    size = 6 * model.config.hidden_size * 4
    logits = {}
    with Checkpoint(path) as checkpoint:
        skeleton = Skeleton(checkpoint)
        report = run_layer_outer(skeleton, list(range(3)), lambda i: logits.__setitem__(
            i, skeleton.model(**batches[i]).logits), activation_budget=2 * size)
    layers = len(find_decoder_layers(model)[1])
    assert report == {"budget_bytes": 2 * size, "peak_bytes": 2 * size, "spills": layers,
                      "spilled_bytes": layers * size}
    with torch.no_grad():
        for i, batch in enumerate(batches):
            torch.testing.assert_close(logits[i], model(**batch).logits, rtol=0, atol=0)


@pytest.mark.parametrize("budget", [-1, 1.5, True, "all"])
def test_a_budget_that_is_not_a_byte_count_is_refused_naming_it(budget):
    with pytest.raises(ValueError, match=f"activation_budget must be .* got {budget!r}"):
        BoundaryActivations(torch.device("cpu"), budget)


def test_a_sequential_module_takes_its_stream_device_and_refuses_one_without_sequential(tmp_path, tiny):
    from lightprune.finetune import MoECausalLM

    path = saved(tiny("qwen3_moe"), tmp_path / "ckpt")
    with pytest.raises(ValueError, match="stream_device='cpu' applies to sequential=True"):
        MoECausalLM(checkpoint=str(path), stream_device="cpu")
    with pytest.raises(ValueError, match="'gpu' is not a device"):
        MoECausalLM(checkpoint=str(path), sequential=True, stream_device="gpu")
    module = MoECausalLM(checkpoint=str(path), sequential=True, stream_device="cpu")
    module.configure_model()
    assert module.skeleton.device == torch.device("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_the_streamed_pass_equals_the_in_memory_one_without_a_host_sync(tiny, tmp_path, monkeypatch):
    """bf16 on the GPU (the dtype torch's grouped matmul runs there): streamed calibration equals the in-memory pass
    of the same model on the same GPU (the same kernels, the same order); every decoder layer of the streamed pass
    runs under ``set_sync_debug_mode("error")`` (from its first module until it returns: the observer's work on each
    layer and batch included), and the CPU's statistics agree within bf16's rounding of the forward."""
    from lightprune.experts.calibration import sequential

    model = tiny("qwen3_moe", seed=2).eval().to(torch.bfloat16)
    path = saved(model, tmp_path / "ckpt")
    batches = [tiny_text_batch(model, batch_size=2, seq_len=16, seed=s, pad=s == 0) for s in range(4)]
    on_gpu = lp.collect_expert_stats(model.cuda(), batches, progress=False)
    run = sequential.run_layer_outer
    guarded = []

    def strict(skeleton, *args, **kwargs):
        handles = []
        for layer in find_decoder_layers(skeleton.model)[1]:
            first = next(layer.children())  # runs once the layer's turn has come (after the lockstep's wait)
            handles.append(first.register_forward_pre_hook(lambda *a: torch.cuda.set_sync_debug_mode("error")))
            handles.append(layer.register_forward_hook(lambda *a: (guarded.append(1),
                                                                   torch.cuda.set_sync_debug_mode(0))))
        try:
            return run(skeleton, *args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(0)
            for handle in handles:
                handle.remove()
    monkeypatch.setattr(sequential, "run_layer_outer", strict)
    streamed = lp.collect_expert_stats(path, batches, progress=False, device="cuda", batches_per_pass=4)
    assert len(guarded) == len(batches) * len(find_decoder_layers(model)[1])
    assert_same_stats(streamed, on_gpu)
    on_cpu = lp.collect_expert_stats(path, batches, progress=False)
    for criterion in on_cpu.metadata["criteria"]:
        for index, values in on_cpu.raw(criterion, "all").items():
            torch.testing.assert_close(streamed.raw(criterion, "all")[index].cpu(), values, rtol=0.1,
                                       atol=0.1 * float(values.abs().max()))

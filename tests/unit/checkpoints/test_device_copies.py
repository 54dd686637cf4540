"""The GPU side of :class:`~lightprune.checkpoints.device.DeviceCopies`, its logic run on the CPU with the CUDA calls
recorded: every loaded tensor is made and copied on the copy stream without blocking, marked used by the stream
the model computes on, and a load ends with that stream waiting for the copy stream, never with the host waiting."""

from __future__ import annotations

import contextlib

import pytest
import torch

from lightprune.checkpoints import Checkpoint, Skeleton
from lightprune.checkpoints.device import DeviceCopies


class _Stream:
    def __init__(self, name: str, calls: list):
        self.name, self.calls = name, calls

    def wait_stream(self, other: "_Stream") -> None:
        self.calls.append(("wait_stream", self.name, other.name))


def test_a_load_queues_its_copies_on_the_copy_stream_and_the_compute_stream_waits_for_them(tiny, tmp_path,
                                                                                           monkeypatch):
    model = tiny("qwen3_moe")
    model.save_pretrained(tmp_path / "ckpt")
    calls: list = []
    copy_stream, compute = _Stream("copy", calls), _Stream("compute", calls)
    current = [compute]

    @contextlib.contextmanager
    def on(stream):
        current[0] = stream
        try:
            yield
        finally:
            current[0] = compute

    with Checkpoint(tmp_path / "ckpt") as checkpoint:
        skeleton = Skeleton(checkpoint)
        copies = skeleton.copies
        copies.cuda, copies._stream = True, copy_stream  # the GPU branch, on the CPU's memory
        monkeypatch.setattr(torch.cuda, "stream", on)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device: current[0])
        monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: calls.append(("record", stream.name)),
                            raising=False)
        original_copy = torch.Tensor.copy_

        def copy_(self, src, non_blocking=False):
            calls.append(("copy", current[0].name, non_blocking))
            return original_copy(self, src)
        monkeypatch.setattr(torch.Tensor, "copy_", copy_)
        monkeypatch.setattr(DeviceCopies, "host_buffer",  # pinned on a GPU machine
                            lambda self, shape, dtype: torch.empty(shape, dtype=dtype))
        skeleton.load(["model.layers.1"])
        names = [n for n in skeleton._names if n.startswith("model.layers.1.")]
        copied = [c for c in calls if c[0] == "copy"]
        assert copied == [("copy", "copy", True)] * len(names)  # each tensor: made and copied on the copy stream
        assert calls.count(("record", "compute")) == len(names)  # and marked used by the compute stream
        assert calls[-1] == ("wait_stream", "compute", "copy")  # the load's end: the compute stream waits
        assert sum(c[0] == "wait_stream" for c in calls) == 1
        monkeypatch.undo()
        state = model.state_dict()
        for name in names:
            assert torch.equal(skeleton._get(name), state[name])


def test_read_ahead_reads_each_next_layer_in_its_thread_and_changes_no_logit(tiny, tmp_path, monkeypatch):
    """A skeleton that reads ahead (as on a GPU; here on the CPU, without a pool): every decoder layer after the
    first is read by the read-ahead thread while the one before computes, the first and what lies outside the layers
    at their load, and three forwards in lockstep give the loaded model's logits exactly."""
    import threading

    from lightprune.checkpoints.sequential import run_layer_outer
    from lightprune.models.layer import find_decoder_layers
    from lightprune.testing.batches import tiny_text_batch

    model = tiny("qwen3_moe", seed=3).eval()
    model.save_pretrained(tmp_path / "ckpt", max_shard_size="20KB")
    batches = [tiny_text_batch(model, batch_size=1, seq_len=6, seed=s) for s in range(3)]
    readers: dict[str, set[str]] = {}
    read_into = Checkpoint.read_into

    def recorded(self, key, out, start=0):
        readers.setdefault(key, set()).add(threading.current_thread().name)
        return read_into(self, key, out, start)
    monkeypatch.setattr(Checkpoint, "read_into", recorded)
    logits = {}
    with Checkpoint(tmp_path / "ckpt") as checkpoint:
        skeleton = Skeleton(checkpoint)
        skeleton.read_ahead = True
        run_layer_outer(skeleton, list(range(3)), lambda i: logits.__setitem__(i, skeleton.model(**batches[i]).logits))
    layers = len(find_decoder_layers(model)[1])
    for key, threads in readers.items():
        later = any(f"layers.{i}." in key for i in range(1, layers))
        assert threads == ({"lightprune-read-ahead"} if later else {threading.current_thread().name}), (key, threads)
    assert any("layers.1." in key for key in readers)
    with torch.no_grad():
        for i, batch in enumerate(batches):
            assert torch.equal(logits[i], model(**batch).logits)


def test_a_read_ahead_that_fails_raises_at_the_load_that_takes_it(tiny, tmp_path, monkeypatch):
    """The read-ahead thread's error is the next load's, naming what could not be read; nothing is half loaded."""
    model = tiny("qwen3_moe")
    model.save_pretrained(tmp_path / "ckpt")
    with Checkpoint(tmp_path / "ckpt") as checkpoint:
        skeleton = Skeleton(checkpoint)
        skeleton.read_ahead = True

        def broken(self, key, out, start=0):
            raise OSError(f"read of {key} failed")
        monkeypatch.setattr(Checkpoint, "read_into", broken)
        skeleton.prefetch(["model.layers.1"])
        with pytest.raises(OSError, match=r"read of model\.layers\.1\..* failed"):
            skeleton.load(["model.layers.1"])
        assert not skeleton.is_resident("model.layers.1")

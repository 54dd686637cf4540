"""The GPU side of :class:`~lightprune.checkpoints.device.DeviceCopies`, its logic run on the CPU with the CUDA calls
recorded: every loaded tensor is made and copied on the copy stream without blocking, marked used by the stream
the model computes on, and a load ends with that stream waiting for the copy stream, never with the host waiting."""

from __future__ import annotations

import contextlib

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

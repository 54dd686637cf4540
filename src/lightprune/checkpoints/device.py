"""Where a streamed path computes, and how a layer's tensors get there: `streaming_device` and
`DeviceCopies`.

Every out-of-core path (streamed scores, calibration, pruning and its verification, a ``sequential`` model) reads a
layer from the safetensors files into host memory and computes on ``device``: the CPU (the default), or a GPU.

On a GPU each tensor is read into pinned host memory and copied to the device on a copy stream of its own
(``non_blocking``), and the stream the layer computes on waits for those copies (``wait_stream``) instead of the
host: the next layer is read by a background thread while this one's kernels are queued
(`lightprune.checkpoints.read_ahead`), and since the pass queues them without waiting for them (the observed
pass reads nothing back per layer or batch), it is copied while the GPU still computes this one. A device tensor made on the
copy stream is marked used by the compute stream (``record_stream``), so its memory is not handed out again before
the kernels that read it have run; the pinned staging buffers are PyTorch's cached host allocations, which wait for
the copies out of them before they are reused. On the CPU the host tensor is the device tensor: the same code, no
copy.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["DeviceCopies", "streaming_device"]


def streaming_device(device: Any) -> torch.device:
    """``device`` ("cpu", "cuda", "cuda:N", an int N or a ``torch.device``) as the device a streamed path runs on,
    with its index ("cuda" is the current CUDA device); a ``ValueError`` naming the value for anything else, and for
    a GPU this machine does not have."""
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(f"device must be 'cpu', 'cuda', 'cuda:N' or a torch.device, got {device!r}")
    try:
        found = torch.device(device)
    except (RuntimeError, ValueError) as err:
        raise ValueError(f"device {device!r} is not a device: use 'cpu', 'cuda' or 'cuda:N'") from err
    if found.type == "cpu":
        return torch.device("cpu")
    if found.type != "cuda":
        raise ValueError(f"device {device!r}: the streamed paths run on 'cpu' or 'cuda[:N]', not on {found.type!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: this torch ({torch.__version__}) sees no CUDA device; use device='cpu'")
    index = torch.cuda.current_device() if found.index is None else found.index
    if index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                         f"cuda:0..cuda:{torch.cuda.device_count() - 1}")
    return torch.device("cuda", index)


class DeviceCopies:
    """Tensors read on the host, put on ``device`` (see the module docstring): `host_buffer` gives the memory
    to read into, `to_device` the tensor the model holds, `finish` makes the computing stream wait for
    the copies of one load."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device) if self.cuda else None
        self._copied = False

    def host_buffer(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Uninitialised host memory of ``shape`` and ``dtype`` to read into: pinned for a GPU."""
        return torch.empty(shape, dtype=dtype, pin_memory=self.cuda)

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (on the host) on the device: itself on the CPU; on a GPU a copy queued on the copy stream."""
        if not self.cuda:
            return tensor if tensor.device == self.device else tensor.to(self.device)
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._stream):
            out = torch.empty(tensor.shape, dtype=tensor.dtype, device=self.device)
            out.copy_(tensor, non_blocking=True)
        out.record_stream(compute)  # freed only once the compute stream has used it
        self._copied = True
        return out

    def finish(self) -> None:
        """The current (computing) stream waits for every copy queued since the last call; the host does not."""
        if self.cuda and self._copied:
            torch.cuda.current_stream(self.device).wait_stream(self._stream)
            self._copied = False

"""The streaming safetensors writer and the reader's byte spans: rows copied from file to file by the kernel (or through
a buffer where there is no kernel copy) read back, with safetensors' own reader, as the rows; a window on a stored
tensor's pages reads its values; a finite check that reads exponent bits finds every NaN and inf."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from lightprune.checkpoints import writer as writer_module
from lightprune.checkpoints.reader import Checkpoint
from lightprune.checkpoints.writer import SafetensorsWriter
from lightprune.export.verify import non_finite


def _source(tmp_path):
    """A one-shard checkpoint of three tensors (a bf16 [6, 4, 3], an fp32 [5], a uint8 [7]) and its tensors."""
    gen = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(6, 4, 3, generator=gen).to(torch.bfloat16), "b": torch.randn(5, generator=gen),
               "c": torch.randint(0, 255, (7,), generator=gen, dtype=torch.uint8)}
    path = tmp_path / "src"
    path.mkdir()
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    (path / "config.json").write_text('{"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]}')
    return path, tensors


@pytest.mark.parametrize("kernel", [True, False], ids=["copy_file_range", "buffer"])
def test_copied_rows_read_back_as_the_rows(tmp_path, monkeypatch, kernel):
    path, tensors = _source(tmp_path)
    if not kernel:
        monkeypatch.setattr(writer_module, "_KERNEL_COPY", False)
    keep = [1, 2, 5]
    want = {"a": tensors["a"][keep], "b": tensors["b"], "c": tensors["c"]}
    with Checkpoint(path) as checkpoint:
        entries = [(name, value.dtype, tuple(value.shape)) for name, value in want.items()]
        with SafetensorsWriter(tmp_path / "got.safetensors", entries, metadata={"format": "pt"}) as out:
            for index in keep:
                out.copy("a", *checkpoint.stored_span("a", index, index + 1))
            out.copy("b", *checkpoint.stored_span("b"))
            out.write("c", checkpoint.stored_tensor("c"))  # a write and kernel copies, interleaved
        assert torch.equal(checkpoint.mapped_rows("a", 2, 5), tensors["a"][2:5])
        assert torch.equal(checkpoint.mapped_rows("b"), tensors["b"])
    got = load_file(tmp_path / "got.safetensors")
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert got[name].dtype == value.dtype and torch.equal(got[name], value), name


def test_a_copy_the_header_has_no_room_for_is_refused(tmp_path):
    path, tensors = _source(tmp_path)
    with Checkpoint(path) as checkpoint:
        out = SafetensorsWriter(tmp_path / "got.safetensors", [("a", torch.bfloat16, (1, 4, 3))])
        with pytest.raises(ValueError, match="got tensor 'b', the header's next is 'a'"):
            out.copy("b", *checkpoint.stored_span("b"))
        with pytest.raises(ValueError, match="got more bytes than its shape"):
            out.copy("a", *checkpoint.stored_span("a", 0, 2))
        out.copy("a", *checkpoint.stored_span("a", 0, 1))
        out.close()
        with pytest.raises(ValueError, match="rows 4:9"):
            checkpoint.stored_span("a", 4, 9)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_the_finite_check_finds_every_nan_and_inf_and_passes_the_extremes(dtype):
    finfo = torch.finfo(dtype)
    values = torch.tensor([0.0, -0.0, finfo.max, -finfo.max, finfo.tiny, finfo.tiny / 4, 1.0], dtype=dtype)
    assert non_finite(values) is None  # the largest, subnormal and signed-zero values are finite
    for bad, said in ((float("nan"), "1 NaN"), (float("inf"), "1 inf"), (float("-inf"), "1 inf")):
        poisoned = torch.zeros(3, 5_000_000, dtype=dtype)  # past one piece of the check
        poisoned[2, 4_999_999] = bad
        assert non_finite(poisoned) == f"{said} (first at [2, 4999999])"

"""save_state writes the calibration state through a temporary file renamed into place: a save that fails names the
file and the cause, removes the temporary file and keeps the state saved before (before, a directory in its place
failed with a bare ``[Errno 21] ... .tmp -> ...`` and left ``calibration_state.rank0.pt.tmp`` behind)."""

from __future__ import annotations

import pytest
import torch

from lightprune.experts.calibration.resume import save_state

SETUP = {"subsets": ["all"], "criteria": None, "low_attn_quantile": 0.02}
MODEL = {"model_type": "qwen3_moe", "experts_per_layer": {"0": 8}, "router_sums": {"0": 1.0}}


def _save(path) -> None:
    save_state(path, {"batches_seen": 0, "layers": {}}, SETUP, MODEL, None)


def test_a_directory_where_the_state_goes_is_named_and_nothing_is_left(tmp_path) -> None:
    path = tmp_path / "calibration_state.rank0.pt"
    path.mkdir()
    with pytest.raises(IsADirectoryError) as raised:
        _save(path)
    assert str(raised.value) == (f"[Errno 21] could not write calibration state {str(path)!r}: it is a directory, not "
                                 "a file: move it away, or write elsewhere; it is as it was")
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name] and path.is_dir()


def test_a_failed_save_keeps_the_state_saved_before(tmp_path, monkeypatch) -> None:
    path = tmp_path / "calibration_state.rank0.pt"
    _save(path)
    before = path.read_bytes()

    def full_disk(obj, file, *args, **kwargs):  # the state is saved through a Python file: its OSError
        file.write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match=rf"^\[Errno 28\] could not write calibration state {str(path)!r}: no space "
                                      r"left on device; it is as it was$"):
        _save(path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [path.name]

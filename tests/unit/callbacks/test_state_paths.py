"""The files a run reads and rewrites are checked before any work: ExpertStats' calibration state and WidthSearch's
candidate weights that are not regular files (a directory, a dangling link, a FIFO), or whose folder cannot be
written, are refused in one line naming them. Before, a directory where the calibration state goes was found only at
the first save, after the batches were calibrated, with a bare ``[Errno 21]`` and the temporary file left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lightprune.callbacks import ExpertStats, WidthSearch

STATE = "calibration_state.rank0.pt"
FIX = r"move it away \(or delete it\), or give ExpertStats another output_dir \(--stats\.output_dir\)$"


class _Trainer:
    """What the callbacks read of a trainer before any work: where the files go, the rank, the callbacks."""

    def __init__(self, root: Path, callbacks=()):
        self.default_root_dir, self.global_rank, self.is_global_zero = str(root), 0, True
        self.calibrating, self.callbacks, self.datamodule = True, list(callbacks), None


@pytest.mark.parametrize("make, cls, why", [
    (lambda p: p.mkdir(), IsADirectoryError, "is a directory, not a file"),
    (lambda p: p.symlink_to(p.parent / "gone.pt"), FileNotFoundError, "is a dangling symlink .*"),
    (lambda p: os.mkfifo(p), ValueError, r"is not a regular file \(a FIFO\)"),
])
@pytest.mark.parametrize("resume", [True, False])
def test_a_calibration_state_that_is_not_a_regular_file_is_refused_before_any_batch(tmp_path, make, cls, why,
                                                                                     resume) -> None:
    make(tmp_path / STATE)
    stats = ExpertStats(save_every_n_batches=4, resume=resume)
    with pytest.raises(cls, match=rf"^calibration state {str(tmp_path / STATE)!r} {why}: the run reads and rewrites "
                                  rf"it there; {FIX}"):
        stats.batches_to_skip(_Trainer(tmp_path))
    assert os.path.lexists(tmp_path / STATE) and sorted(p.name for p in tmp_path.iterdir()) == [STATE]


def test_a_directory_state_is_refused_even_without_saving(tmp_path) -> None:
    (tmp_path / STATE).mkdir()  # read (resume) and deleted at the end of calibration: never skipped silently
    with pytest.raises(IsADirectoryError, match=r"is a directory, not a file"):
        ExpertStats().batches_to_skip(_Trainer(tmp_path))


def test_a_state_folder_that_cannot_be_written_is_refused(tmp_path, monkeypatch) -> None:
    run = tmp_path / "run"
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path)  # root ignores chmod: simulated
    with pytest.raises(PermissionError, match=rf"^calibration state {str(run / STATE)!r}: its folder {str(run)!r} "
                                              r"cannot be written .*read-only for this user"):
        ExpertStats(save_every_n_batches=2).batches_to_skip(_Trainer(run))
    assert ExpertStats().batches_to_skip(_Trainer(run)) == 0  # nothing saved, nothing there: nothing to refuse


def test_no_state_and_a_writable_folder_start_afresh(tmp_path) -> None:
    assert ExpertStats(save_every_n_batches=2).batches_to_skip(_Trainer(tmp_path / "run")) == 0
    assert not (tmp_path / "run").exists()


def test_a_width_search_candidate_path_that_is_not_a_file_is_refused_at_setup(tmp_path) -> None:
    (tmp_path / "candidates" / "t2v_0.5.pt").mkdir(parents=True)
    search = WidthSearch(grid=[0.0, 0.5], stages=["v2v", "t2v"], progress=False)
    trainer = _Trainer(tmp_path, [search])
    trainer.datamodule = object()  # the data checks pass: on to the paths
    with pytest.raises(IsADirectoryError, match=rf"^WidthSearch candidate weights "
                                                rf"{str(tmp_path / 'candidates' / 't2v_0.5.pt')!r} is a directory"):
        search.setup(trainer, None, "fit")
    (tmp_path / "candidates" / "t2v_0.5.pt").rmdir()
    search.setup(trainer, None, "fit")  # the paths pass
    with pytest.raises(ValueError, match="WidthSearch needs a datamodule"):  # the data first, then the paths
        search.setup(_Trainer(tmp_path, [search]), None, "fit")

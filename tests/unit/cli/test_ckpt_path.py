"""PruneTrainer checks the Lightning checkpoint a run resumes from (``--ckpt_path``) before any setup hook and before
the model is built: one line naming it and what it is (a directory, a special file, a dangling link, empty, missing).
Before, Lightning read it only after the model was built, with a bare ``[Errno 21]`` or an empty ``EOFError``."""

from __future__ import annotations

import os

import pytest
from lightning.pytorch.demos.boring_classes import BoringModel

from lightprune.cli.trainer import PruneTrainer

FIX = r"; give the \.ckpt file a run saved \(ModelCheckpoint's\), or leave ckpt_path out to start afresh$"


class _Model(BoringModel):
    built = False

    def configure_model(self) -> None:
        type(self).built = True


def _trainer(tmp_path) -> PruneTrainer:
    return PruneTrainer(accelerator="cpu", max_epochs=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, limit_train_batches=1,
                        limit_val_batches=0, default_root_dir=str(tmp_path / "run"))


@pytest.mark.parametrize("name, make, cls, why", [
    ("dir", lambda p: p.mkdir(), IsADirectoryError, "is a directory, not a file"),
    ("empty.ckpt", lambda p: p.write_bytes(b""), ValueError, r"is empty \(0 bytes\)"),
    ("dangling.ckpt", lambda p: p.symlink_to(p.parent / "gone.ckpt"), FileNotFoundError, "is a dangling symlink .*"),
    ("fifo.ckpt", lambda p: os.mkfifo(p), ValueError, r"is not a regular file \(a FIFO\)"),
    ("missing.ckpt", lambda p: None, FileNotFoundError, "does not exist"),
])
def test_a_checkpoint_that_cannot_be_read_is_refused_before_the_model_is_built(tmp_path, name, make, cls,
                                                                               why) -> None:
    path = tmp_path / name
    make(path)
    _Model.built = False
    with pytest.raises(cls, match=rf"^Lightning checkpoint \(ckpt_path\) {str(path)!r} {why}{FIX}"):
        _trainer(tmp_path).fit(_Model(), ckpt_path=str(path))
    assert not _Model.built


def test_dev_null_is_named_as_a_character_device(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"'/dev/null' is not a regular file \(a character device\)"):
        _trainer(tmp_path).validate(_Model(), ckpt_path="/dev/null")


def test_a_saved_checkpoint_resumes(tmp_path) -> None:
    trainer = _trainer(tmp_path)
    trainer.fit(_Model())
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    again = _trainer(tmp_path)
    again.fit_loop.max_epochs = 2
    again.fit(_Model(), ckpt_path=str(tmp_path / "last.ckpt"))
    assert again.current_epoch == 2

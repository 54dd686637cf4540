"""``--ckpt_path`` naming a file that is no Lightning checkpoint (safetensors weights, random bytes) is refused from its
first bytes in one line; what torch's loader still fails on, and a failed write of torch.save, are one line of the
command too."""

from __future__ import annotations

import pickle
import sys

import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from lightprune.cli import app
from lightprune.cli.trainer import PruneTrainer, checkpoint_format_problem

FIX = "give the .ckpt file a run saved (ModelCheckpoint's), or leave ckpt_path out to start afresh"


def _trainer(tmp_path) -> PruneTrainer:
    return PruneTrainer(accelerator="cpu", max_epochs=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, limit_train_batches=1,
                        limit_val_batches=0, default_root_dir=str(tmp_path / "run"))


def test_a_safetensors_file_is_named_as_one(tmp_path) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    with pytest.raises(ValueError) as info:
        _trainer(tmp_path).fit(BoringModel(), ckpt_path=str(path))
    assert str(info.value) == (f"Lightning checkpoint (ckpt_path) {str(path)!r} is a safetensors file (model weights), "
                               "not a Lightning checkpoint; a model's weights are read from its folder, "
                               f"--model.init_args.checkpoint; {FIX}")


def test_random_bytes_are_refused_naming_their_start(tmp_path) -> None:
    path = tmp_path / "noise.ckpt"
    path.write_bytes(b"\x15\xe3*\x0bU\r8{" + bytes(range(64)))
    with pytest.raises(ValueError) as info:
        _trainer(tmp_path).validate(BoringModel(), ckpt_path=str(path))
    assert str(info.value) == (f"Lightning checkpoint (ckpt_path) {str(path)!r} is not a Lightning checkpoint: it "
                               "starts with b'\\x15\\xe3*\\x0bU\\r8{', neither torch's zip archive "
                               f"(b'PK\\x03\\x04') nor its pickle (b'\\x80'); {FIX}")


def test_torch_files_pass(tmp_path) -> None:
    torch.save({"a": 1}, tmp_path / "new.ckpt")
    torch.save({"a": 1}, tmp_path / "old.ckpt", _use_new_zipfile_serialization=False)
    assert checkpoint_format_problem(tmp_path / "new.ckpt") is None
    assert checkpoint_format_problem(tmp_path / "old.ckpt") is None


def test_what_the_loader_still_fails_on_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    path = tmp_path / "bad.ckpt"
    path.write_bytes(b"\x80\x02garbage that is no pickle")

    def run():
        _trainer(tmp_path).validate(BoringModel(), ckpt_path=str(path))

    monkeypatch.setattr(app, "cli_main", run)
    monkeypatch.setattr(sys, "argv", ["lightprune", "validate"])
    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as info:
        app.main()
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1
    assert err.startswith("lightprune: error: the Lightning checkpoint (ckpt_path) cannot be loaded (UnpicklingError: ")
    assert err.endswith(f"); {FIX}\n")


def test_a_failed_torch_save_write_is_one_line_and_other_runtime_errors_are_not_swallowed(monkeypatch, capsys) -> None:
    message = ("could not write calibration state '/runs/a/calibration_state.rank0.pt': no space left on device; it "
               "is as it was")

    def full():
        raise RuntimeError(message)

    monkeypatch.setattr(app, "cli_main", full)
    monkeypatch.setattr(sys, "argv", ["lightprune", "calibrate"])
    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as info:
        app.main()
    assert (info.value.code, capsys.readouterr().err) == (2, f"lightprune: error: {message}\n")

    def bug():
        raise RuntimeError("something else")

    monkeypatch.setattr(app, "cli_main", bug)
    with pytest.raises(RuntimeError, match="^something else$"):
        app.main()
    monkeypatch.setattr(app, "cli_main", lambda: pickle.loads(b"\x80\x02garbage"))  # not Lightning's load
    with pytest.raises(pickle.UnpicklingError):
        app.main()


@pytest.mark.parametrize("head", [b"\x80\x02garbage that is no pickle", b"\x80" + bytes(range(1, 200))])
def test_lightnings_read_of_the_hyperparameters_is_one_line_too(tmp_path, monkeypatch, capsys, head) -> None:
    """LightningCLI loads ckpt_path's hyperparameters as it parses the command line, before the trainer runs: bytes
    that start as a pickle but are none (torch's unpickler raises UnpicklingError, IndexError, ...) are one line."""
    from fixtures import REPO

    path = tmp_path / "bad.ckpt"
    path.write_bytes(head)
    monkeypatch.setattr(sys, "argv", ["lightprune", "validate", "--config", str(REPO / "configs" / "aimer_tiny.yaml"),
                                      "--trainer.default_root_dir", str(tmp_path / "run"), "--ckpt_path", str(path)])
    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as info:
        app.main()
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"lightprune: error: Lightning checkpoint (ckpt_path) {str(path)!r} cannot be loaded (")
    assert err.endswith(f"); {FIX}\n")

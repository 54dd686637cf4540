"""The command line's first pass (no Lightning) refuses a callbacks list that conflicts, a checkpoint directory that
is the run's folder and a plan_path that is no file, each in one line; ``~`` in a path option is the home folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from fixtures import REPO

from lightprune.cli.command_line_checks import check_command_line
from lightprune.cli.options import OptionError

JOB = ["export", "--config", "configs/aimer_tiny.yaml"]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch) -> None:
    monkeypatch.chdir(REPO)


def _config(tmp_path: Path, callbacks: str) -> str:
    text = (REPO / "configs" / "aimer_tiny.yaml").read_text()
    head = text[:text.index("  callbacks:")]
    path = tmp_path / "job.yaml"
    path.write_text(head + "  callbacks:\n" + callbacks)
    return str(path)


def test_expert_pruning_twice_in_one_folder_is_refused_naming_it(tmp_path) -> None:
    config = _config(tmp_path, "    - class_path: lightprune.callbacks.Export\n"
                               "    - class_path: lightprune.callbacks.ExpertPruning\n"
                               "      init_args: {criterion: aimer, ratio: 0.25}\n"
                               "    - class_path: lightprune.callbacks.ExpertPruning\n"
                               "      init_args: {criterion: aimer, ratio: 0.5}\n")
    run = tmp_path / "run"
    with pytest.raises(OptionError, match=f"^ExpertPruning is listed twice writing into '{run}': the second's "
                                          "plan.json and scores.json would replace the first's"):
        check_command_line(["export", "--config", config, "--trainer.default_root_dir", str(run)])
    with pytest.raises(OptionError, match="^Export is listed 2 times in trainer.callbacks"):
        check_command_line(["export", "--config", _config(tmp_path, "    - lightprune.callbacks.Export\n"
                                                                    "    - lightprune.callbacks.ExpertPruning\n"),
                            "--trainer.default_root_dir", str(run), "--trainer.callbacks+=lightprune.callbacks.Export"])


@pytest.mark.parametrize("overwrite", [[], ["--export.overwrite", "true"]])
def test_a_checkpoint_dir_that_is_the_run_folder_or_holds_it_is_refused_up_front(tmp_path, overwrite) -> None:
    run = tmp_path / "run"
    for ckpt, says in ((run, "is the run's folder"), (tmp_path, "holds the run's folder"),
                       (run / "report.json", "is the run's report.json")):
        with pytest.raises(OptionError, match=rf"^export.checkpoint_dir '{ckpt}' {says}.*; choose another "
                                              r"--export.checkpoint_dir"):
            check_command_line([*JOB, "--trainer.default_root_dir", str(run), "--export.checkpoint_dir", str(ckpt),
                                *overwrite])
    check_command_line([*JOB, "--trainer.default_root_dir", str(run), "--export.checkpoint_dir",
                        str(tmp_path / "ckpt"), *overwrite])
    assert not run.exists()


def test_plan_path_a_directory_or_under_home(tmp_path, monkeypatch) -> None:
    run = tmp_path / "run"
    with pytest.raises(OptionError, match=rf"^export.plan_path: '{tmp_path}' is a directory, not a plan file"):
        check_command_line([*JOB, "--trainer.default_root_dir", str(run), "--export.plan_path", str(tmp_path)])
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "plan.json").write_text(json.dumps({"keep": {"0": [0]}, "num_experts": {"0": 16}}))
    check_command_line([*JOB, "--trainer.default_root_dir", str(run), "--export.plan_path", "~/plan.json"])
    with pytest.raises(OptionError, match=r"^export.plan_path: '~/gone.json' does not exist$"):
        check_command_line([*JOB, "--trainer.default_root_dir", str(run), "--export.plan_path", "~/gone.json"])


def test_a_plan_path_that_is_a_special_file_or_a_broken_link_is_said_as_such(tmp_path) -> None:
    """A FIFO or a dangling link as --export.plan_path was "does not exist"; the first pass says what is there."""
    import os

    run = tmp_path / "run"
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "dangling.json").symlink_to(tmp_path / "gone.json")
    with pytest.raises(OptionError) as info:
        check_command_line([*JOB, "--trainer.default_root_dir", str(run), "--export.plan_path",
                            str(tmp_path / "fifo.json")])
    assert str(info.value) == (f"export.plan_path: {str(tmp_path / 'fifo.json')!r} is not a regular file (a FIFO): "
                               "name the plan file itself")
    with pytest.raises(OptionError) as info:
        check_command_line([*JOB, "--trainer.default_root_dir", str(run), "--export.plan_path",
                            str(tmp_path / "dangling.json")])
    assert str(info.value) == (f"export.plan_path: {str(tmp_path / 'dangling.json')!r} is a dangling symlink (its "
                               f"target {str(tmp_path / 'gone.json')!r} does not exist): name the plan file itself")


def test_the_console_says_it_in_one_line_with_exit_status_2(tmp_path, monkeypatch, capsys) -> None:
    from lightprune.cli import command

    monkeypatch.setattr(sys, "argv", ["lightprune", *JOB, "--trainer.default_root_dir", str(tmp_path / "run"),
                                      "--export.checkpoint_dir", str(tmp_path / "run"), "--export.overwrite", "true"])
    with pytest.raises(SystemExit) as info:
        command.main()
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lightprune: error: export.checkpoint_dir") and "\n" not in err
    assert "overwrite=True" not in err and not (tmp_path / "run").exists()

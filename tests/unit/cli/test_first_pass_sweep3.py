"""First-pass refusals from the third fault sweep: an option a later --config replaces, a path holding an unexpanded
variable or ``~user`` of no user, a run directory that is a broken symlink or whose name is too long."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lightprune.cli.command_line_checks import check_command_line
from lightprune.cli.options import OptionError


def _config(tmp_path, text: str, name: str = "c.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _refusal(argv: list[str]) -> str:
    with pytest.raises(OptionError) as info:
        check_command_line(argv)
    return str(info.value)


def test_an_option_before_a_config_that_sets_it_is_refused_naming_both(tmp_path) -> None:
    config = _config(tmp_path, f"trainer:\n  default_root_dir: {tmp_path / 'cfg'}\n")
    assert _refusal(["export", "--trainer.default_root_dir", str(tmp_path / "x"), "--prune.ratio", "0.25",
                     "--config", config]) == (
        f"--trainer.default_root_dir is given before --config {config}, which sets trainer.default_root_dir too and "
        "would replace it (options and configs are applied in order); give --config first, then "
        "--trainer.default_root_dir")


def test_a_class_option_before_a_config_setting_it_under_init_args_is_refused(tmp_path) -> None:
    config = _config(tmp_path, "model:\n  class_path: lightprune.finetune.MoECausalLM\n  init_args:\n"
                               "    checkpoint: testbed:text-small\n")
    assert _refusal(["export", "--model.init_args.checkpoint", "a/b/c", "-c", config]).startswith(
        f"--model.init_args.checkpoint is given before --config {config}, which sets model.init_args.checkpoint too")


def test_an_option_the_later_config_does_not_set_or_after_it_is_taken(tmp_path) -> None:
    config = _config(tmp_path, f"trainer:\n  default_root_dir: {tmp_path / 'cfg'}\n")
    check_command_line(["export", "--trainer.max_epochs", "1", "--config", config])
    check_command_line(["export", "--config", config, "--trainer.default_root_dir", str(tmp_path / "x")])


def test_a_variable_in_a_configs_run_directory_is_refused_naming_it(tmp_path) -> None:
    config = _config(tmp_path, "trainer:\n  default_root_dir: $HOME/lp_run\n")
    assert _refusal(["export", "--config", config]) == (
        f"config file {config!r}: trainer.default_root_dir: run directory '$HOME/lp_run' holds the variable $HOME, "
        "which lightprune does not expand (no shell reads a config file); write the path out, or give it on the "
        "command line, where the shell expands it")
    config = _config(tmp_path, "trainer:\n  default_root_dir: /tmp/${RUNS}/a\n", "d.yaml")
    assert "holds the variable ${RUNS}," in _refusal(["export", "--config", config])
    check_command_line(["export", "--trainer.default_root_dir", str(tmp_path / "price$") ])  # no variable name


def test_a_home_of_no_user_is_refused(tmp_path) -> None:
    assert _refusal(["export", "--trainer.default_root_dir", "~nosuchuser_lp/C05"]) == (
        "--trainer.default_root_dir: run directory '~nosuchuser_lp/C05': there is no user 'nosuchuser_lp' on this "
        "machine, so '~nosuchuser_lp' names no home folder; write the folder out")


def test_a_dangling_link_or_a_loop_as_run_directory_is_refused(tmp_path) -> None:
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "gone")
    assert _refusal(["export", "--trainer.default_root_dir", str(dangling)]) == (
        f"--trainer.default_root_dir: {str(dangling)!r} is a dangling symlink (its target "
        f"{str(tmp_path / 'gone')!r} does not exist); create the target folder, remove the link, or give another "
        "folder")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert _refusal(["export", "--trainer.default_root_dir", str(loop)]) == (
        f"--trainer.default_root_dir: {str(loop)!r} is a symlink loop (-> {str(loop)!r}); remove the link or give "
        "another folder")
    assert _refusal(["export", "--trainer.default_root_dir", str(dangling / "run")]) == (
        f"--trainer.default_root_dir: {str(dangling / 'run')!r} cannot be created: {str(dangling)!r} is a dangling "
        f"symlink (-> {str(tmp_path / 'gone')!r}); give a folder elsewhere")


def test_a_name_too_long_is_refused(tmp_path) -> None:
    root = str(tmp_path / ("n" * 300))
    assert _refusal(["export", "--trainer.default_root_dir", root]) == (
        f"--trainer.default_root_dir: {root!r} cannot be created: the name {'n' * 24 + '...'!r} is 300 bytes long, "
        "longer than a file system takes (255); give a shorter name")


def test_the_command_says_it_in_one_line(tmp_path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    code = ("import sys; sys.argv = ['lightprune', 'export', '--trainer.default_root_dir', sys.argv[1]]; "
            "from lightprune.cli.command import main; main()")
    env = {key: value for key, value in os.environ.items() if key != "LIGHTPRUNE_DEBUG"}
    done = subprocess.run([sys.executable, "-c", code, str(loop)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert (done.returncode, done.stderr) == (2, f"lightprune: error: --trainer.default_root_dir: {str(loop)!r} is a "
                                                 f"symlink loop (-> {str(loop)!r}); remove the link or give another "
                                                 "folder\n")

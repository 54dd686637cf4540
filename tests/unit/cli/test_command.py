"""The console script: its help needs no Lightning import and names every subcommand and callback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fixtures import REPO

from lightprune.cli import command


def test_help_names_every_subcommand_and_callback() -> None:
    import lightprune.callbacks
    from lightprune.cli.app import LightpruneCLI

    assert set(command.SUBCOMMANDS) == set(LightpruneCLI.subcommands())
    assert set(command.CALLBACKS) == set(lightprune.callbacks.__all__)
    for name in (*command.SUBCOMMANDS, *command.CALLBACKS, "--verbose"):
        assert f"  {name} " in command.HELP


def test_help_imports_neither_lightning_nor_torch() -> None:
    code = ("import sys; sys.argv = ['lightprune', '--help']; from lightprune.cli.command import main; main(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'torch', 'transformers'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: lightprune")
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_everything_else_goes_to_the_lightning_cli(monkeypatch) -> None:
    import lightprune.cli.app

    calls = []
    monkeypatch.setattr(lightprune.cli.app, "main", lambda: calls.append(list(sys.argv)))
    monkeypatch.setattr(sys, "argv", ["lightprune", "fit", "--help"])
    command.main()
    assert calls == [["lightprune", "fit", "--help"]]


# a command line, the first pass's line (cwd: the repository, whose configs/ the commands name)
REFUSED = [
    (["calibrate", "--config", "configs/quickstrt.yaml"],
     "--config 'configs/quickstrt.yaml': no such file (did you mean 'configs/quickstart.yaml'?)"),
    (["calibrate", "--confg", "configs/quickstart.yaml"],
     "`lightprune calibrate` has no option '--confg' (did you mean '--config'?); `lightprune calibrate --help` lists "
     "them"),
    (["calibrat", "--config", "configs/quickstart.yaml"],
     "'calibrat' is not a subcommand of lightprune (did you mean 'calibrate'?); the subcommands: fit, validate, test, "
     "predict, calibrate, export, convert-gguf"),
    (["convert-guff", "model", "out.gguf"], "'convert-guff' is not a subcommand of lightprune (did you mean "
     "'convert-gguf'?); the subcommands: fit, validate, test, predict, calibrate, export, convert-gguf"),
    (["--verbose", "export", "--config", "configs/aimer_tiny.yaml", "--trainer.max_step", "3"],
     "`lightprune export` has no option '--trainer.max_step' (did you mean '--trainer.max_steps'?); `lightprune export "
     "--help` lists them"),
    (["--nope", "export"], "lightprune has no option '--nope'; before the subcommand it takes --config, "
     "--print_config, --help"),
    (["export", "--config"], "--config needs a value: a YAML config file (configs/ holds the recipes)"),
    (["export", "--config", "configs"], "--config 'configs' is a folder; give a config file (for example "
     "configs/aimer.yaml, configs/aimer_testbed.yaml)"),
]


@pytest.mark.parametrize("argv,line", REFUSED, ids=[" ".join(argv)[:40] for argv, _ in REFUSED])
def test_the_first_pass_refuses_in_one_line_with_status_2(argv, line, monkeypatch, capsys) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["lightprune", *argv])
    with pytest.raises(SystemExit) as info:
        command.main()
    assert info.value.code == 2
    assert capsys.readouterr().err == f"lightprune: error: {line}\n"


def test_the_first_pass_refuses_without_importing_lightning_or_torch(tmp_path) -> None:
    """Each refusal of the first pass (a name, a config file, a run directory, a class path) in one process that
    never imports Lightning, torch or transformers."""
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    (tmp_path / "afile").write_text("x")
    jobs = [["calibrate", "--config", "configs/quickstrt.yaml"], ["calibrat"], ["export", "--trainer.max_step", "3"],
            ["export", "--config", str(tmp_path / "empty.yaml")],
            ["export", "--config", "configs/aimer_tiny.yaml", "--trainer.default_root_dir", str(tmp_path / "afile")],
            ["export", "--config", "configs/aimer_tiny.yaml", "--trainer.callbacks+=subprocess.Popen"],
            ["export", "--config", "configs/aimer_tiny.yaml", "--trainer.callbacks+=lightning.pytorch.callbacks.Early"
             "Stoping"]]
    code = ("import sys\nfrom lightprune.cli.command import main\nfor job in %r:\n    sys.argv = ['lightprune', *job]\n"
            "    try:\n        main()\n    except SystemExit as exit:\n        print(exit.code)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'torch', 'transformers'}))") % jobs
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={k: v for k, v in os.environ.items() if k != "LIGHTPRUNE_DEBUG"})
    assert done.stdout.split() == ["2"] * len(jobs) + ["[]"], done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == len(jobs) and all(line.startswith("lightprune: error: ") for line in lines), lines


def test_help_print_config_env_and_inline_configs_reach_the_parser(tmp_path, monkeypatch, capsys) -> None:
    """What the first pass lets through as before: `SUBCOMMAND --help`, --print_config (over an earlier run's
    outputs), jsonargparse's environment variables and a config given inline."""
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["lightprune", "export", "--help"])
    with pytest.raises(SystemExit) as info:
        command.main()
    assert info.value.code == 0 and capsys.readouterr().out.startswith("usage: lightprune [options] export")
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "model" / "config.json").write_text("{}")
    monkeypatch.setenv("JSONARGPARSE_DEFAULT_ENV", "true")
    monkeypatch.setenv("PL_EXPORT__TRAINER__MAX_STEPS", "7")
    monkeypatch.setattr(sys, "argv", ["lightprune", "export", "--config", "configs/aimer_tiny.yaml", "--config",
                                      "trainer: {max_epochs: 2}", "--trainer.default_root_dir", str(run),
                                      "--print_config"])
    with pytest.raises(SystemExit) as info:
        command.main()
    out = capsys.readouterr().out
    assert info.value.code == 0 and "  max_steps: 7\n" in out and "  max_epochs: 2\n" in out

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
    (["export", "--config", "configs/aimer_tiny.yaml", "--prune.rattio", "0.3"], "--prune.rattio: ExpertPruning has "
     "no option 'rattio' (did you mean 'ratio'?); its options: criterion, ratio, allocation, normalize, seed, "
     "output_dir, subset, alpha, n_per_layer"),
    (["--config", "configs/aimer_tiny.yaml", "export"], "config file 'configs/aimer_tiny.yaml' is given before the "
     "subcommand, where a config maps subcommands to their options (export: {...}), and its key 'seed_everything' is "
     "not a subcommand; give it after the subcommand: lightprune export --config configs/aimer_tiny.yaml ..."),
    (["export", "--config", "configs/aimer_tiny.yaml", "--trainer.precision", "17-true"], "--trainer.precision: "
     "precision '17-true' is not one Lightning takes (did you mean '16-true'?); it takes transformer-engine, "
     "transformer-engine-float16, 16-true, 16-mixed, bf16-true, bf16-mixed, 32-true, 64-true, bf16 (or 64, 32, 16)"),
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


def test_a_long_value_is_cut_in_the_line_the_command_prints(tmp_path, monkeypatch, capsys) -> None:
    """A 1 MB criterion was echoed whole: the line keeps 200 characters of it and says how many more it had."""
    config = tmp_path / "job.yaml"
    config.write_text((REPO / "configs" / "aimer_tiny.yaml").read_text().replace("criterion: aimer",
                                                                                 "criterion: " + "a" * 1_000_000))
    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["lightprune", "export", "--config", str(config), "--trainer.default_root_dir",
                                      str(tmp_path / "run")])
    with pytest.raises(SystemExit) as info:
        command.main()
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.splitlines()) == 1 and len(err) < 600
    assert f"unknown criterion '{'a' * 199}… (999801 more characters)'; available: aimer, " in err


def test_a_signal_before_lightning_has_loaded_is_one_line(monkeypatch, capsys) -> None:
    """SIGINT or SIGTERM while the command checks its options or imports Lightning (its first seconds) gave a
    75-line KeyboardInterrupt traceback: one line and 128 + the signal."""
    import signal
    import time
    import types

    import lightprune.cli.command_line_checks

    class Unhandled(Exception):
        """What reaches the test where the command does not handle the signal."""

    def send(signum):
        def handler(*args, **kwargs):
            os.kill(os.getpid(), signum)
            time.sleep(5)  # the handler raises at the next bytecode: never reached
        return handler

    def unhandled(signum, frame):
        raise Unhandled(signal.Signals(signum).name)

    previous = {signum: signal.signal(signum, unhandled) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
        monkeypatch.setattr(sys, "argv", ["lightprune", "--verbose", "export", "--config", "c.yaml"])
        monkeypatch.setattr(lightprune.cli.command_line_checks, "check_command_line", send(signal.SIGINT))
        with pytest.raises(SystemExit) as info:
            command.main()
        assert info.value.code == 130
        assert capsys.readouterr().err == ("lightprune: interrupted by SIGINT during `export`; nothing was published "
                                           "(outputs are renamed into place only when complete)\n")
        loading = types.ModuleType("lightprune.cli.app")
        loading.__getattr__ = send(signal.SIGTERM)  # Lightning's import, interrupted
        monkeypatch.setitem(sys.modules, "lightprune.cli.app", loading)
        monkeypatch.setattr(lightprune.cli.command_line_checks, "check_command_line", lambda *args, **kwargs: None)
        with pytest.raises(SystemExit) as info:
            command.main()
        assert info.value.code == 143
        assert capsys.readouterr().err.startswith("lightprune: interrupted by SIGTERM during `export` while loading "
                                                  "Lightning; nothing was published")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

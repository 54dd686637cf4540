"""The console script: its help needs no Lightning import and names every subcommand and callback."""

from __future__ import annotations

import subprocess
import sys

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

"""A stopping signal while the console script starts (its imports, the statements before its handlers are in place)
is one line and the shell's status, never a KeyboardInterrupt traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fixtures import REPO, default_signals

#: the console script, with SIGINT sent to itself at a chosen point of its start (deterministic, unlike a timer)
_START = """
import builtins, os, signal, sys
where = sys.argv.pop(1)
sys.argv = ["lightprune", "export", "--config", "configs/aimer_tiny.yaml", "--trainer.default_root_dir", sys.argv[1]]
if where == "import":  # while cli/command.py imports its option specs
    real = builtins.__import__
    def fake(name, *args, **kwargs):
        if name == "lightprune.callbacks.options":
            os.kill(os.getpid(), signal.SIGINT)
        return real(name, *args, **kwargs)
    builtins.__import__ = fake
    from lightprune.cli.command import main
    builtins.__import__ = real
else:  # in main, after the start's handlers are given back and before interrupt.installed()
    from lightprune.cli.command import main
    from lightprune.core import interrupt
    def installed():
        os.kill(os.getpid(), signal.SIGINT)
        raise AssertionError("not reached")
    interrupt.installed = installed
main()
"""


@pytest.mark.parametrize("where", ["import", "main"])
def test_sigint_while_starting_is_one_line_and_130(tmp_path, where) -> None:
    env = {key: value for key, value in os.environ.items() if key != "LIGHTPRUNE_DEBUG"}
    done = subprocess.run([sys.executable, "-c", _START, where, str(tmp_path / "run")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, preexec_fn=default_signals)
    assert (done.returncode, done.stderr) == (130, "lightprune: interrupted by SIGINT while starting; nothing was "
                                                   "done\n")
    assert not (tmp_path / "run").exists()


def test_importing_the_module_elsewhere_keeps_the_programs_handlers() -> None:
    code = ("import signal; before = signal.getsignal(signal.SIGINT); import lightprune.cli.command; "
            "assert signal.getsignal(signal.SIGINT) is before, signal.getsignal(signal.SIGINT); print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          preexec_fn=default_signals)
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")

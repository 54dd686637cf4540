"""An interrupted command (SIGTERM, SIGINT) exits non-zero with one line saying what it was doing and what it kept;
refusals that need no model come before anything is built."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures import REPO, default_signals, signals_at_default

from lightprune.cli import app as cli
from lightprune.core import interrupt


@pytest.fixture(autouse=True)
def _signals_as_from_a_terminal():
    """The signals these tests send act as in a command a terminal started, under ``nohup`` or in the background too."""
    with signals_at_default():
        yield


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_raises_interrupted_naming_what_ran_and_the_handlers_return_after(signum) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with pytest.raises(interrupt.Interrupted) as info, interrupt.installed(), interrupt.doing("training a testbed"):
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the handler runs at the next bytecode: never reached
    assert info.value.signum == signum and info.value.doing == "training a testbed"
    assert info.value.exit_status == 128 + signum
    assert {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)} == before


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_the_command_prints_one_line_and_exits_with_128_plus_the_signal(monkeypatch, capsys, signum, status) -> None:
    def run():
        interrupt.kept("/runs/a/model")
        with interrupt.doing("exporting"):
            os.kill(os.getpid(), signum)
            time.sleep(5)

    monkeypatch.setattr(cli, "cli_main", run)
    monkeypatch.setattr(sys, "argv", ["lightprune", "calibrate", "--config", "c.yaml"])
    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == status
    name = signal.Signals(signum).name
    assert capsys.readouterr().err == (f"lightprune: interrupted by {name} during `calibrate` while exporting; "
                                       "kept: /runs/a/model\n")
    interrupt.kept("/elsewhere")  # outside a command nothing is recorded
    monkeypatch.setattr(cli, "cli_main", lambda: os.kill(os.getpid(), signum) or time.sleep(5))
    with pytest.raises(SystemExit):
        cli.main()
    assert capsys.readouterr().err.endswith("nothing was published (outputs are renamed into place only when "
                                            "complete)\n")


@pytest.mark.exhaustive
def test_sigterm_while_the_first_run_trains_its_testbed_exits_143_and_caches_nothing(tmp_path) -> None:
    """The real command, on a fresh cache: it says it trains the testbed; SIGTERM then stops it at once, with
    status 143 (Lightning alone exits 0), one line naming the training and what was kept (the text corpus, cached
    before the training), and no testbed, not even a partial one, in the cache."""
    env = {**os.environ, "LIGHTPRUNE_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen([sys.executable, "-m", "lightprune.cli.app", "calibrate", "--config",
                                str(REPO / "configs" / "quickstart.yaml"), "--trainer.default_root_dir",
                                str(tmp_path / "run")], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True,
                               preexec_fn=default_signals)
    seen = []
    try:
        for line in process.stderr:
            seen.append(line)
            if "training the embedded testbed" in line:
                process.send_signal(signal.SIGTERM)
                break
        err = "".join(seen) + process.stderr.read()
        status = process.wait(timeout=120)
    finally:
        process.kill()
    assert status == 143, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("lightprune: interrupted by SIGTERM during `calibrate` while training the embedded "
                           "testbed text-small"), last
    corpus = re.search(r"; kept: (\S+) \(cached\)$", last)  # the text corpus, built before the training
    assert corpus and Path(corpus.group(1)).parent == tmp_path / "cache" / "testbed", last
    assert Path(corpus.group(1)).name.startswith("corpus-") and Path(corpus.group(1)).is_dir()
    assert not [p for p in (tmp_path / "cache" / "testbed").iterdir() if "text-small" in p.name]


@pytest.mark.exhaustive
def test_an_existing_output_directory_is_refused_before_anything_is_built(tmp_path) -> None:
    """The export directory exists: refused from the options alone, before the model (whose checkpoint here does
    not even exist, which building it would report) or Lightning's trainer is made."""
    (tmp_path / "run" / "model").mkdir(parents=True)
    (tmp_path / "run" / "model" / "config.json").write_text("{}")
    done = subprocess.run([sys.executable, "-m", "lightprune.cli.app", "export", "--config",
                           str(REPO / "configs" / "aimer_tiny.yaml"), "--model.init_args.tiny", "null",
                           "--model.init_args.checkpoint", str(tmp_path / "missing"), "--trainer.default_root_dir",
                           str(tmp_path / "run")],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("lightprune: error:") and str(tmp_path / "run" / "model") in last, last
    assert "overwrite true" in last and "missing" not in last.replace(str(tmp_path / "run"), ""), last
    assert "GPU available" not in done.stderr


def test_the_command_line_pass_refuses_an_existing_export_directory_before_lightning(tmp_path, monkeypatch) -> None:
    """The console script's first pass (no Lightning imported) refuses an export directory holding an earlier run,
    wherever the options place it, and leaves alone every job that replaces it or writes elsewhere."""
    from lightprune.cli.command_line_checks import check_command_line
    from lightprune.cli.options import OptionError

    monkeypatch.chdir(REPO)
    (tmp_path / "run" / "model").mkdir(parents=True)
    (tmp_path / "run" / "model" / "config.json").write_text("{}")
    (tmp_path / "other" / "model").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x").write_text("x")
    job = ["export", "--config", "configs/aimer_tiny.yaml"]
    refused = [[*job, "--trainer.default_root_dir", str(tmp_path / "run")],
               [*job, "--export.checkpoint_dir", str(tmp_path / "elsewhere")],
               [*job, "--trainer.default_root_dir", str(tmp_path / "other"), "--export.output_dir",
                str(tmp_path / "run")],
               [*job, "--trainer.default_root_dir", str(tmp_path / "run"), "--export.overwrite", "false"]]
    for argv in refused:
        with pytest.raises(OptionError, match=r"exists and is not empty; replace it with --export.overwrite true"):
            check_command_line(argv)
    accepted = [[*job, "--trainer.default_root_dir", str(tmp_path / "run"), "--export.overwrite", "true"],
                [*job, "--trainer.default_root_dir", str(tmp_path / "other")],  # an empty model/ is written into
                [*job, "--trainer.default_root_dir", str(tmp_path / "new")],
                [*job, "--trainer.default_root_dir", str(tmp_path / "run"), "--export.checkpoint_dir",
                 str(tmp_path / "new")],
                [*job, "--trainer.default_root_dir", str(tmp_path / "run"),  # the list rebuilt: left to the parser
                 "--trainer.callbacks", "lightprune.callbacks.Export"]]
    for argv in accepted:
        check_command_line(argv)
    with pytest.raises(OptionError, match=r"export.plan_path: '.*missing.json' does not exist"):
        check_command_line([*job, "--trainer.default_root_dir", str(tmp_path / "new"), "--export.plan_path",
                            str(tmp_path / "missing.json")])
    script = ("import sys\nfrom lightprune.cli import command\n"
              f"sys.argv = ['lightprune', *{refused[0]!r}]\n"
              "try:\n    command.main()\nexcept SystemExit as err:\n"
              "    print(err.code, 'lightning' in sys.modules, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=False,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.stdout.split() == ["2", "False", "False"], done.stdout + done.stderr[-2000:]
    assert done.stderr.strip().startswith(f"lightprune: error: output directory '{tmp_path / 'run' / 'model'}' "
                                          "exists and is not empty"), done.stderr


def test_both_export_callbacks_refuse_an_earlier_run_from_their_options_alone(tmp_path) -> None:
    from lightprune.callbacks import Export, WidthExport

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    for cls, address in ((Export, "export"), (WidthExport, "width_export")):
        with pytest.raises(FileExistsError, match=rf"{tmp_path / 'model'}.*--{address}\.overwrite true"):
            cls.preflight({"overwrite": False}, str(tmp_path))
        with pytest.raises(FileExistsError, match="--trainer.default_root_dir"):
            cls.preflight({"output_dir": str(tmp_path)}, None)
        cls.preflight({"overwrite": True}, str(tmp_path))
        cls.preflight({"checkpoint_dir": str(tmp_path / "new")}, str(tmp_path))


def test_a_closed_terminal_stops_the_command_as_sigterm_does() -> None:
    """SIGHUP (the terminal or ssh session closed) is one of the signals the command stops on, status 129, and the
    publishing hold applies to it as to SIGTERM."""
    from lightprune.core import interrupt

    with interrupt.installed(), pytest.raises(interrupt.Interrupted) as stopped:
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(5)
    assert stopped.value.exit_status == 129
    done = []
    with interrupt.installed(), pytest.raises(interrupt.Interrupted) as stopped:
        with interrupt.publishing():
            interrupt.hold()
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.1)
            done.append("published")  # held until the group ends
    assert done == ["published"] and stopped.value.exit_status == 129


def test_a_signal_the_command_was_started_with_ignored_stays_ignored() -> None:
    """Under ``nohup`` (SIGHUP ignored: a job meant to outlive its terminal) or as a background job (SIGINT ignored)
    the command does not stop on that signal; the others still stop it."""
    from lightprune.core import interrupt

    for ignored in (signal.SIGHUP, signal.SIGINT):  # from the fixture's defaults
        signal.signal(ignored, signal.SIG_IGN)
        with interrupt.installed():
            os.kill(os.getpid(), ignored)
            time.sleep(0.2)  # a handler would run at the next bytecode
            assert signal.getsignal(ignored) is signal.SIG_IGN
            with pytest.raises(interrupt.Interrupted) as stopped:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
        assert stopped.value.signum == signal.SIGTERM and signal.getsignal(ignored) is signal.SIG_IGN
        signal.signal(ignored, signal.default_int_handler if ignored == signal.SIGINT else signal.SIG_DFL)


#: a child whose module teardown (after every exit function) sends itself ``signal`` and then says it lived on
_TEARDOWN_CHILD = """
import os, signal, sys
from lightprune.core import interrupt
if sys.argv[1] == "quiet":
    interrupt.quiet_teardown()
class Late:
    def __del__(self, kill=os.kill, pid=os.getpid(), signum=int(sys.argv[2]), write=os.write):
        kill(pid, signum)  # the module globals may be gone by now: all held as defaults
        write(1, b"lived on")
late = Late()  # a module global: deleted as Python tears the modules down, its signals' default action restored
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_in_the_interpreters_teardown_leaves_a_finished_command_finished(signum) -> None:
    """A Ctrl-C a second after the command said it was done (torch's modules being torn down) ended it silently
    with status 130; the command ignores the stopping signals once the last exit function has run."""
    run = [sys.executable, "-c", _TEARDOWN_CHILD]
    plain = subprocess.run([*run, "plain", str(int(signum))], capture_output=True, text=True, timeout=60,
                           preexec_fn=default_signals)
    assert (plain.returncode, plain.stdout) == (-signum, "")  # what Python does: killed by the signal, no line
    quiet = subprocess.run([*run, "quiet", str(int(signum))], capture_output=True, text=True, timeout=60,
                           preexec_fn=default_signals)
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "lived on", "")


def test_the_command_registers_the_quiet_teardown_first(monkeypatch) -> None:
    from lightprune.cli import command

    order = []
    monkeypatch.setattr(interrupt, "quiet_teardown", lambda: order.append("quiet_teardown"))
    monkeypatch.setattr(command, "_run", lambda: order.append("run"))
    monkeypatch.setattr(sys, "argv", ["lightprune", "export"])
    command.main()
    assert order == ["quiet_teardown", "run"]


#: a script (no handler of its own) publishing a checkpoint and the run files that describe it as one group, as
#: ``scripts/run_recipe`` does through the run state; the signal comes once the checkpoint is in place
_PUBLISHING_SCRIPT = """
import os, sys
from pathlib import Path
from lightprune.callbacks.state import RunState
from lightprune.checkpoints import staging
run, signum = Path(sys.argv[1]), int(sys.argv[2])
commit = staging._commit
def commit_then_signal(staged, out):
    commit(staged, out)
    os.kill(os.getpid(), signum)  # held: the run files are not in place yet
staging._commit = commit_then_signal
class Export:
    phase = "export"
    def run(self, trainer, pl_module):
        with staging.staging_dir(run / "model", overwrite=True) as staged:
            (staged / "weights").write_text("new")
        print("checkpoint in place", flush=True)
state = RunState()
state.stage_file(run / "plan.json", {"plan": "new"})
state.stage_text(run / "config.yaml", "run: new\\n")
state.add_job_end(Export())
state.finish_job(None, None)
print("lived on", flush=True)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
@pytest.mark.exhaustive
def test_a_scripts_signal_held_for_a_group_ends_it_once_every_file_of_the_group_is_in_place(tmp_path, signum) -> None:
    """SIGTERM (or SIGHUP) in a script once its checkpoint is in place: the staging's block ends, the run files are
    committed, then the signal ends the process (status 143: a shell's 128 + 15), without a line (library use)."""
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "model" / "weights").write_text("old")
    (run / "plan.json").write_text("old plan")
    (run / "config.yaml").write_text("run: old\n")
    done = subprocess.run([sys.executable, "-c", _PUBLISHING_SCRIPT, str(run), str(int(signum))], capture_output=True,
                          text=True, timeout=300, check=False, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          preexec_fn=default_signals)
    assert done.returncode == -signum, done.stderr[-3000:]  # ended by the signal itself
    assert done.stdout == "checkpoint in place\n" and "lightprune:" not in done.stderr, done.stderr[-3000:]
    assert (run / "model" / "weights").read_text() == "new"
    assert json.loads((run / "plan.json").read_text()) == {"plan": "new"}
    assert (run / "config.yaml").read_text() == "run: new\n"
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "model", "plan.json"]  # no journal, nothing aside


def test_a_signal_held_while_a_group_publishes_is_said_at_once_inside_the_command(capfd) -> None:
    """Inside the command (installed), a held signal is one line on stderr as it comes, naming what it waits for; a
    second one adds nothing; the group's end raises the first. (Outside the command nothing is said: the script
    above.)"""
    said = []
    with (interrupt.installed(), pytest.raises(interrupt.Interrupted) as stopped,
          interrupt.publishing(what="the run files"), interrupt.publishing(what="'/runs/a/model'")):
        interrupt.hold()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        said.append(capfd.readouterr().err)
    assert said == ["lightprune: SIGINT received; stopping once '/runs/a/model' and the run files are in place\n"]
    assert stopped.value.signum == signal.SIGINT and capfd.readouterr().err == ""

"""A command stopped by SIGTERM, SIGINT or SIGHUP: one line saying what it was doing and what it kept, and a non-zero
exit.

Without this, Lightning turns SIGTERM into ``SIGTERMException`` (a ``SystemExit`` without a code: status 0) at its
next loop check, and SIGINT into ``sys.exit(1)`` after its own notice, so a ``&&`` chain carries on after a killed
run. `installed` (around the ``lightprune`` command) makes these signals (and SIGHUP, a closed terminal,
whose default action ends the process where it is) raise `Interrupted` where the
main thread is: it reaches the command through every ``finally`` (a staging directory is removed, nothing
half-written is published) and Lightning's ``on_exception`` hooks, and the command prints `describe` and
exits ``128 + signal`` (143 for SIGTERM, 130 for SIGINT, 129 for SIGHUP), as a shell reports a process the signal
killed.
Lightning's own SIGTERM handler, set over this one while a trainer runs, calls it too.

A Python script calling the API has no such handler: SIGTERM's and SIGHUP's default action ends the process where
it is. `terminated_cleanly` (around a staging directory's life, `lightprune.checkpoints.staging`) makes
them raise `Interrupted` there too, for the duration of the block, so that what the block staged is removed,
then ends the process as that signal ends it (status 143, 129); a process with its own handler keeps it.

Outputs published together (a run's checkpoint and the plan, scores and config that describe it) are one
`publishing` group: from the moment the first of them is put in place (`hold`), a signal is held until
all of them are, then raised (in a script, where `terminated_cleanly` caught it: sent again, the process ending
as that signal ends it). Inside `installed` (the command) a held signal is said at once on stderr, in one line.

What a run kept is what its parts say they published (`kept`: a pruned checkpoint renamed into place, a
testbed written to its cache); what it was doing, the innermost `doing` block when the signal came (training
the embedded testbed).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

__all__ = ["STOPPING", "Interrupted", "describe", "doing", "exit_interrupted", "hold", "installed", "kept", "publishing",
           "quiet_teardown", "terminated_cleanly"]

#: the signals a command stops on: SIGTERM (kill, a job scheduler), SIGINT (Ctrl-C), SIGHUP (its terminal closed)
STOPPING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))
#: those whose default action ends a process (a script's SIGINT raises KeyboardInterrupt already)
_TERMINATING = tuple(signum for signum in STOPPING if signum != signal.SIGINT)
_KEPT: list[str] = []
_DOING: list[str] = []
_INSTALLED = [False]
_TEARDOWN = [False]  # quiet_teardown registered


class Interrupted(BaseException):
    """Raised in the main thread by SIGTERM, SIGINT or SIGHUP inside `installed`, by SIGTERM or SIGHUP inside
    `terminated_cleanly` (where they had their default action), and at the end of a `publishing` group
    that held one of them (a BaseException, as KeyboardInterrupt: an ``except Exception`` does not swallow it).
    ``signum``: the signal; ``doing``: the innermost `doing` block when it arrived (None: none)."""

    def __init__(self, signum: int):
        self.signum = signum
        self.doing = _DOING[-1] if _DOING else None
        super().__init__(f"interrupted by {signal.Signals(signum).name}")

    @property
    def exit_status(self) -> int:
        """128 + the signal's number, as a shell reports a process the signal killed."""
        return 128 + self.signum


#: publishing groups open (:func:`publishing`), whether one holds the signals (:func:`hold`), the signal held, what
#: each open block publishes, and what :func:`terminated_cleanly` blocks left to the group's end: (the signals whose
#: handler they keep until then, the signals that came)
_GROUP: dict[str, Any] = {"open": 0, "holding": False, "pending": None, "before": [], "what": [], "after": []}


def _raise(signum: int, frame: object) -> None:
    if _held(signum):
        return
    raise Interrupted(signum)


def _held(signum: int) -> bool:
    """Whether the signal is held for the end of the publishing group (recorded: the first one, said on stderr inside
    `installed`)."""
    if _GROUP["open"] and _GROUP["holding"]:
        if _GROUP["pending"] is None:
            _GROUP["pending"] = signum
            if _INSTALLED[0]:
                _say_held(signum)
        return True
    return False


def _say_held(signum: int) -> None:
    """One line on stderr: the signal came and waits for what the open publishing blocks put in place (written to
    the file descriptor: a signal handler may run while ``sys.stderr`` is being written; a closed terminal, as after
    SIGHUP, takes no line, which changes nothing else)."""
    names = list(dict.fromkeys(what for what in reversed(_GROUP["what"]) if what))
    what = " and ".join(names) or "what is being published"
    verb = "are" if len(names) > 1 else "is"
    line = f"lightprune: {signal.Signals(signum).name} received; stopping once {what} {verb} in place\n"
    with contextlib.suppress(OSError):
        os.write(2, line.encode("utf-8", "backslashreplace"))


@contextlib.contextmanager
def publishing(before_hold: Callable[..., None] | None = None, what: str | None = None) -> Iterator[None]:
    """Outputs published together (a run's pruned checkpoint and its plan, scores and config): once `hold` is
    called inside the block (the first of them is about to be put in place), SIGTERM, SIGINT and SIGHUP are held
    until the outermost block ends, then raised as `Interrupted` there, so that a signal never leaves a
    checkpoint without the run files that describe it; one `terminated_cleanly` caught is sent again there
    instead, its default action restored first (the process ends as that signal ends it). Before `hold`, the
    block is interrupted as anywhere else. ``before_hold``: called by the first `hold` inside the block with its
    arguments, the signals held (the run state writes the run files aside there,
    `lightprune.checkpoints.journal`); ``what``: what the block puts in place, for the line a held signal prints
    inside `installed`."""
    _GROUP["open"] += 1
    _GROUP["what"].append(what)
    if before_hold is not None:
        _GROUP["before"].append(before_hold)
    try:
        yield
    finally:
        _GROUP["open"] -= 1
        _GROUP["what"].pop()
        if before_hold is not None and before_hold in _GROUP["before"]:
            _GROUP["before"].remove(before_hold)
        if not _GROUP["open"]:
            pending, after = _GROUP["pending"], _GROUP["after"]
            _GROUP.update(pending=None, holding=False, after=[])
            _default_again([signum for ours, _ in after for signum in ours],
                           [signum for _, came in after for signum in came])
            if pending is not None:
                raise Interrupted(pending)


def _default_again(signals: list[int], came: list[int]) -> None:
    """Restore the default action of ``signals``, then send the first of ``came`` (if any) to this process again, which
    it ends."""
    for signum in signals:
        signal.signal(signum, signal.SIG_DFL)
    if came:
        os.kill(os.getpid(), came[0])


def hold(*args: Any) -> None:
    """From now until the outermost `publishing` block ends, hold SIGTERM, SIGINT and SIGHUP (outside one:
    nothing); the blocks' ``before_hold`` callbacks run first, once, with ``args``."""
    if _GROUP["open"]:
        _GROUP["holding"] = True
        before, _GROUP["before"] = _GROUP["before"], []
        for callback in before:
            callback(*args)


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Inside the block SIGTERM, SIGINT and SIGHUP (`STOPPING`) raise `Interrupted` (in the main thread:
    handlers can only be set there; elsewhere nothing changes) and `kept` records; the previous handlers return
    after it. A signal the process was started with ignored stays ignored: ``nohup``'s SIGHUP (a job meant to outlive
    its terminal), a background job's SIGINT."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _raise) for signum in STOPPING
                if signal.getsignal(signum) is not signal.SIG_IGN}
    _INSTALLED[0] = True
    _KEPT.clear()
    try:
        yield
    finally:
        _INSTALLED[0] = False
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def terminated_cleanly() -> Iterator[None]:
    """Inside the block, in the main thread, SIGTERM and SIGHUP, where they have their default action, raise
    `Interrupted` (the block's ``finally`` and ``except`` clauses run: a staging directory is removed), or are
    held inside a `publishing` group that holds; once the block is left the default action returns and, when a
    signal came, it is sent again: the process ends as that signal ends it (status 143, 129). A block left inside an
    open `publishing` group (a run's checkpoint in place, its files not yet) keeps its handler until the
    group's outermost block ends, which does that then. Elsewhere (another thread, a handler of the caller's own or
    `installed`'s, a signal ignored) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ours = [signum for signum in _TERMINATING if signal.getsignal(signum) is signal.SIG_DFL]
    came: list[int] = []

    def handler(signum: int, frame: object) -> None:
        came.append(signum)
        if not _held(signum):
            raise Interrupted(signum)

    for signum in ours:
        signal.signal(signum, handler)
    try:
        yield
    finally:
        if _GROUP["open"]:  # the rest of the group is published first: its outermost block ends this
            _GROUP["after"].append((ours, came))
        else:
            _default_again(ours, came)


def quiet_teardown() -> None:
    """Ignore the stopping signals during the interpreter's teardown, from when its last exit function has run.

    Python restores these signals' default action after its exit functions and before it tears its modules down
    (about a second with torch and transformers loaded): a Ctrl-C there ended a command that had finished, and said
    so, silently with status 130. Registered before any other exit function (the command's first step), this one runs
    after every other (exit functions run last registered first: torch's, a process group's, which a signal can still
    stop) and leaves only the modules' teardown unstoppable but by SIGKILL. Main thread only."""
    if threading.current_thread() is threading.main_thread() and not _TEARDOWN[0]:
        import atexit

        atexit.register(_ignore_stopping)
        _TEARDOWN[0] = True


def _ignore_stopping() -> None:
    for signum in STOPPING:
        signal.signal(signum, signal.SIG_IGN)


def kept(what: str) -> None:
    """Record something the run has published (a path and what it holds), for the line an interruption prints
    (only inside `installed`, around a command: a Python session keeps no list)."""
    if _INSTALLED[0]:
        _KEPT.append(what)


@contextlib.contextmanager
def doing(what: str) -> Iterator[None]:
    """Inside the block, an interruption says the run was ``what`` (``"training the embedded testbed"``)."""
    _DOING.append(what)
    try:
        yield
    finally:
        _DOING.pop()


def exit_interrupted(err: Interrupted, command: str | None = None) -> NoReturn:
    """End an interrupted command: `describe`'s line on stderr and exit ``err.exit_status`` (with
    ``LIGHTPRUNE_DEBUG`` set, ``err`` is raised again, with its traceback)."""
    if os.environ.get("LIGHTPRUNE_DEBUG"):
        raise err
    print(describe(err, command), file=sys.stderr)
    raise SystemExit(err.exit_status) from None


def describe(err: Interrupted, command: str | None = None) -> str:
    """The one line an interrupted command prints: the signal, the command, what it was doing, what it kept."""
    during = f" during `{command}`" if command else ""
    activity = f" while {err.doing}" if err.doing else ""
    held = f"kept: {'; '.join(_KEPT)}" if _KEPT else "nothing was published (outputs are renamed into place " \
        "only when complete)"
    return f"lightprune: {err}{during}{activity}; {held}"

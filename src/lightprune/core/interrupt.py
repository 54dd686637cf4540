"""A command stopped by SIGTERM or SIGINT: one line saying what it was doing and what it kept, and a non-zero exit.

Without this, Lightning turns SIGTERM into ``SIGTERMException`` (a ``SystemExit`` without a code: status 0) at its
next loop check, and SIGINT into ``sys.exit(1)`` after its own notice, so a ``&&`` chain carries on after a killed
run. :func:`installed` (around the ``lightprune`` command) makes both signals raise :class:`Interrupted` where the
main thread is: it reaches the command through every ``finally`` (a staging directory is removed, nothing
half-written is published) and Lightning's ``on_exception`` hooks, and the command prints :func:`describe` and
exits ``128 + signal`` (143 for SIGTERM, 130 for SIGINT), as a shell reports a process the signal killed.
Lightning's own SIGTERM handler, set over this one while a trainer runs, calls it too.

What a run kept is what its parts say they published (:func:`kept`: a pruned checkpoint renamed into place, a
testbed written to its cache); what it was doing, the innermost :func:`doing` block when the signal came (training
the embedded testbed).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["Interrupted", "describe", "doing", "installed", "kept"]

_KEPT: list[str] = []
_DOING: list[str] = []
_INSTALLED = [False]


class Interrupted(BaseException):
    """Raised in the main thread by SIGTERM or SIGINT inside :func:`installed` (a BaseException, as
    KeyboardInterrupt: an ``except Exception`` does not swallow it). ``signum``: the signal; ``doing``: the
    innermost :func:`doing` block when it arrived (None: none)."""

    def __init__(self, signum: int):
        self.signum = signum
        self.doing = _DOING[-1] if _DOING else None
        super().__init__(f"interrupted by {signal.Signals(signum).name}")

    @property
    def exit_status(self) -> int:
        """128 + the signal's number, as a shell reports a process the signal killed."""
        return 128 + self.signum


def _raise(signum: int, frame: object) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Inside the block SIGTERM and SIGINT raise :class:`Interrupted` (in the main thread: handlers can only be
    set there; elsewhere nothing changes) and :func:`kept` records; the previous handlers return after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _raise) for signum in (signal.SIGTERM, signal.SIGINT)}
    _INSTALLED[0] = True
    _KEPT.clear()
    try:
        yield
    finally:
        _INSTALLED[0] = False
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def kept(what: str) -> None:
    """Record something the run has published (a path and what it holds), for the line an interruption prints
    (only inside :func:`installed`, around a command: a Python session keeps no list)."""
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


def describe(err: Interrupted, command: str | None = None) -> str:
    """The one line an interrupted command prints: the signal, the command, what it was doing, what it kept."""
    during = f" during `{command}`" if command else ""
    activity = f" while {err.doing}" if err.doing else ""
    held = f"kept: {'; '.join(_KEPT)}" if _KEPT else "nothing was published (outputs are renamed into place " \
        "only when complete)"
    return f"lightprune: {err}{during}{activity}; {held}"

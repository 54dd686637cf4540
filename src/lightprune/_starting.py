"""The ``lightprune`` console script's first moments: a stopping signal (SIGTERM, SIGINT, SIGHUP) before the
command's own handling is in place (`lightprune.core.interrupt`, set up by `lightprune.cli.command.main`)
is one line and the shell's status (128 + the signal), at once, instead of a traceback from whichever import it
lands in. Imported first by the package, so that only Python's own start-up comes before it; it acts in the console
script only (``lightprune ...``, ``python -m lightprune.cli.command``): a program importing lightprune keeps its
handlers. A signal ignored from the start (``nohup``'s SIGHUP, a background job's SIGINT) stays ignored.

A leaf: standard library only.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["started"]


def _stopped_while_starting(signum: int, frame: object) -> None:
    line = f"lightprune: interrupted by {signal.Signals(signum).name} while starting; nothing was done\n"
    try:
        os.write(2, line.encode())
    finally:
        os._exit(128 + signum)


#: the handlers the stopping signals had before :func:`_stopped_while_starting` replaced them
_BEFORE: dict[int, object] = {}
_SCRIPT = os.path.basename(sys.argv[0]) in ("lightprune", "lightprune.exe", "lightprune-script.py")
_MODULE = sys.argv[:1] == ["-m"] and "lightprune.cli.command" in getattr(sys, "orig_argv", [])[:4]  # runpy's search
if _SCRIPT or _MODULE:
    for _signum in (getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name)):
        if signal.getsignal(_signum) is not signal.SIG_IGN:
            _BEFORE[_signum] = signal.signal(_signum, _stopped_while_starting)


def started() -> None:
    """Give the stopping signals back the handlers they had (a SIGINT then raises KeyboardInterrupt, which the
    command turns into its one line)."""
    while _BEFORE:
        signum, handler = _BEFORE.popitem()
        signal.signal(signum, handler)  # type: ignore[arg-type]

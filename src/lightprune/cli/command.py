"""The ``lightprune`` console script.

``lightprune`` / ``lightprune -h`` / ``lightprune --help`` print the subcommands and lightprune's callbacks without
importing Lightning (a fraction of a second); everything else goes to :func:`lightprune.cli.app.main`, whose
``lightprune SUBCOMMAND --help`` lists every option.
"""

from __future__ import annotations

import os
import signal
import sys


def _stopped_while_starting(signum: int, frame: object) -> None:
    """A stopping signal before the command's own handling is in place (the imports of its first steps): one line
    and the shell's status (128 + the signal), at once; nothing has been read or written yet."""
    line = f"lightprune: interrupted by {signal.Signals(signum).name} while starting; nothing was done\n"
    try:
        os.write(2, line.encode())
    finally:
        os._exit(128 + signum)


#: the signals stopped at once while the command starts (SIGTERM, SIGINT, SIGHUP), unless ignored from the start
#: (``nohup``'s SIGHUP, a background job's SIGINT), with the handlers they had: installed before anything else, in
#: the console script only (``lightprune ...``, ``python -m lightprune.cli.command``; a program importing this module
#: keeps its handlers)
_STARTING: dict[int, object] = {}
if __name__ == "__main__" or os.path.basename(sys.argv[0]) in ("lightprune", "lightprune.exe", "lightprune-script.py"):
    for _signum in (getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name)):
        if signal.getsignal(_signum) is not signal.SIG_IGN:
            _STARTING[_signum] = signal.signal(_signum, _stopped_while_starting)


def _started() -> None:
    """Give the stopping signals back the handlers they had before :func:`_stopped_while_starting` (a SIGINT then
    raises KeyboardInterrupt, which :func:`main` turns into its one line)."""
    while _STARTING:
        signum, handler = _STARTING.popitem()
        signal.signal(signum, handler)  # type: ignore[arg-type]


from lightprune.callbacks.options import OPTIONS  # after the handlers
from lightprune.cli.options import SUBCOMMANDS

__all__ = ["CALLBACKS", "HELP", "SUBCOMMANDS", "main"]

#: lightprune's callbacks (``--trainer.callbacks+=NAME``), in the order a job usually lists them, with what each does
CALLBACKS: dict[str, str] = {name: spec.summary for name, spec in OPTIONS.items()}

HELP = "\n".join([
    "usage: lightprune [--verbose] {" + ",".join(SUBCOMMANDS) + "} [--config CONFIG] [options]",
    "       lightprune [--verbose] convert-gguf EXPORT OUTFILE [options]",
    "",
    "Train, calibrate, prune and export Mixture-of-Experts models (LightningCLI).",
    "",
    "subcommands:",
    *(f"  {name:11s} {text}" for name, text in SUBCOMMANDS.items()),
    "  convert-gguf  convert a uniform export to GGUF with llama.cpp's converter (outside Lightning)",
    "",
    "lightprune's callbacks (in a config's trainer.callbacks, or --trainer.callbacks+=NAME) and the address",
    "of their options, whatever the callbacks' order (--prune.ratio 0.3 --export.overwrite true):",
    *(f"  {name:14s} --{spec.address + '.*':15s} {spec.summary}" for name, spec in OPTIONS.items()),
    "",
    "options:",
    "  --verbose   show third-party notices that lightprune drops (also LIGHTPRUNE_VERBOSE=1)",
    "",
    "`lightprune SUBCOMMAND --help` lists every option of a subcommand; configs/ holds the recipes.",
])


def main() -> None:
    """Print :data:`HELP` for a bare ``lightprune`` or ``--help``; otherwise check the callbacks' options
    (:func:`lightprune.cli.options.check_command_line`, before Lightning is imported: a typo is reported at once)
    and run :func:`lightprune.cli.app.main`; ``convert-gguf`` runs :func:`lightprune.cli.convert_gguf.main`.
    SIGTERM, SIGINT and SIGHUP are handled from the start (:mod:`lightprune.core.interrupt`): a Ctrl-C while Lightning
    loads is one line and exit status 130, as later; once the command is done, the interpreter's teardown is not
    stopped by them (:func:`lightprune.core.interrupt.quiet_teardown`)."""
    try:
        if sys.argv[1:] in ([], ["-h"], ["--help"]):
            print(HELP)
            _started()
            return
        from lightprune.cli.names import subcommand
        from lightprune.core import interrupt

        interrupt.quiet_teardown()  # first: its exit function runs after every other
        _started()
        try:
            with interrupt.installed():
                _run()
        except interrupt.Interrupted as err:
            interrupt.exit_interrupted(err, subcommand(sys.argv[1:]))
    except KeyboardInterrupt:  # between the start's handlers and interrupt.installed(): a few statements
        if os.environ.get("LIGHTPRUNE_DEBUG"):
            raise
        print("lightprune: interrupted by SIGINT while starting; nothing was done", file=sys.stderr)
        raise SystemExit(130) from None


def _run() -> None:
    if [arg for arg in sys.argv[1:] if arg != "--verbose"][:1] == ["convert-gguf"]:  # no Lightning: its own parser
        from lightprune.cli.convert_gguf import main as convert_gguf

        args = sys.argv[1:]
        args.remove("convert-gguf")
        convert_gguf(args)
        return
    from lightprune.cli.options import OptionError, check_command_line
    from lightprune.core import interrupt
    from lightprune.core.jsonio import clip_values

    try:
        check_command_line((arg for arg in sys.argv[1:] if arg != "--verbose"), others=["convert-gguf"])
    except (OptionError, ValueError, OSError, RuntimeError) as err:  # RuntimeError: pathlib's ``~user``, a loop
        if os.environ.get("LIGHTPRUNE_DEBUG"):
            raise
        print(clip_values(f"lightprune: error: {err}"), file=sys.stderr)
        raise SystemExit(2) from None
    with interrupt.doing("loading Lightning"):
        from lightprune.cli.app import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()

"""The ``lightprune`` console script.

``lightprune`` / ``lightprune -h`` / ``lightprune --help`` print the subcommands and lightprune's callbacks without
importing Lightning (a fraction of a second); everything else goes to `lightprune.cli.app.main`, whose
``lightprune SUBCOMMAND --help`` lists every option.
"""

from __future__ import annotations

import os
import sys

from lightprune import _starting  # (the package's first import installed its handlers)
from lightprune.callbacks.options import OPTIONS
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
    """Print `HELP` for a bare ``lightprune`` or ``--help``; otherwise check the callbacks' options
    (`lightprune.cli.command_line_checks.check_command_line`, before Lightning is imported: a typo is reported at
    once) and run `lightprune.cli.app.main`; ``convert-gguf`` runs `lightprune.cli.convert_gguf.main`.
    SIGTERM, SIGINT and SIGHUP are handled from the start (`lightprune.core.interrupt`): a Ctrl-C while Lightning
    loads is one line and exit status 130, as later; once the command is done, the interpreter's teardown is not
    stopped by them (`lightprune.core.interrupt.quiet_teardown`)."""
    try:
        if sys.argv[1:] in ([], ["-h"], ["--help"]):
            print(HELP)
            _starting.started()
            return
        from lightprune.cli.names import subcommand
        from lightprune.core import interrupt

        interrupt.quiet_teardown()  # first: its exit function runs after every other
        _starting.started()
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
    from lightprune.cli.command_line_checks import check_command_line
    from lightprune.cli.options import OptionError
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

"""The ``lightprune`` console script.

``lightprune`` / ``lightprune -h`` / ``lightprune --help`` print the subcommands and lightprune's callbacks without
importing Lightning (a fraction of a second); everything else goes to :func:`lightprune.cli.main`, whose
``lightprune SUBCOMMAND --help`` lists every option.
"""

from __future__ import annotations

import sys

__all__ = ["CALLBACKS", "HELP", "SUBCOMMANDS", "main"]

#: subcommand -> what it does
SUBCOMMANDS: dict[str, str] = {
    "fit": "fine-tune (for example LoRA on the routers), then prune and export with the configured callbacks",
    "validate": "one evaluation pass over the validation set",
    "test": "one evaluation pass over the test set (Evaluate, ReportPage)",
    "predict": "run the model's predict step",
    "calibrate": "forward passes over calibration data, no optimizer (ExpertStats: REAP, Delta-H, MAEP, ...)",
    "export": "score, select, prune and export without data or training (weight criteria: AIMER, ...)",
}
#: lightprune's callbacks (``--trainer.callbacks+=NAME``), in the order a job usually lists them
CALLBACKS: dict[str, str] = {
    "ExpertStats": "calibration statistics of every expert (calibrate)",
    "RouterDelta": "router sensitivity: how far fine-tuning moved each router row",
    "ExpertPruning": "score with a criterion and select the experts to keep (plan.json)",
    "Export": "prune, save, reload and verify the checkpoint",
    "WidthSearch": "MWOP: staged search over attention paths and FFN channels",
    "WidthExport": "MWOP: export the width-pruned model with its sparse kernels",
    "Evaluate": "perplexity / task accuracy before and after",
    "ReportPage": "report.md of the run",
}

HELP = "\n".join([
    "usage: lightprune [--verbose] {" + ",".join(SUBCOMMANDS) + "} [--config CONFIG] [options]",
    "",
    "Train, calibrate, prune and export Mixture-of-Experts models (LightningCLI).",
    "",
    "subcommands:",
    *(f"  {name:11s} {text}" for name, text in SUBCOMMANDS.items()),
    "",
    "lightprune's callbacks (in a config's trainer.callbacks, or --trainer.callbacks+=NAME):",
    *(f"  {name:14s} {text}" for name, text in CALLBACKS.items()),
    "",
    "options:",
    "  --verbose   show third-party notices that lightprune drops (also LIGHTPRUNE_VERBOSE=1)",
    "",
    "`lightprune SUBCOMMAND --help` lists every option of a subcommand; configs/ holds the recipes.",
])


def main() -> None:
    """Print :data:`HELP` for a bare ``lightprune`` or ``--help``; otherwise run :func:`lightprune.cli.main`."""
    if sys.argv[1:] in ([], ["-h"], ["--help"]):
        print(HELP)
        return
    from lightprune.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()

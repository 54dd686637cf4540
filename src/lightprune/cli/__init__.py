"""The entry chain: the ``lightprune`` console script and everything that turns a command line or a recipe into a
run.

- `command`: the console script (help without Lightning, option checks before it loads);
- `options`: the callbacks' option addresses and the checks of a command line, read from each callback's
  option spec (`lightprune.callbacks.options`), with `names` (the subcommands' and the trainer's option
  names), `slots` (the classes each ``class_path`` slot accepts) and `inputs` (the files a job reads);
- `app`: LightningCLI with lightprune's subcommands (``calibrate``, ``export``), `errors` its one-line
  errors, `trainer` the Trainer that runs the end-of-job steps, `recipe` one call per recipe,
  `quiet` the third-party notices dropped from a run;
- `convert_gguf`: ``lightprune convert-gguf``
  ([`lightprune.export.gguf.convert_to_gguf`][lightprune.export.gguf.convert.convert_to_gguf]), dispatched by
  `command` before Lightning is imported.

May import: everything below it; nothing imports it but the package's lazy top level (``lp.run_recipe``).
"""

from __future__ import annotations

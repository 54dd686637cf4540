"""The entry chain: the ``lightprune`` console script and everything that turns a command line or a recipe into a
run.

- :mod:`.command`: the console script (help without Lightning, option checks before it loads);
- :mod:`.options`: the callbacks' option addresses and the checks of a command line, read from each callback's
  option spec (:mod:`lightprune.callbacks.options`), with :mod:`.names` (the subcommands' and the trainer's option
  names), :mod:`.slots` (the classes each ``class_path`` slot accepts) and :mod:`.inputs` (the files a job reads);
- :mod:`.app`: LightningCLI with lightprune's subcommands (``calibrate``, ``export``), :mod:`.errors` its one-line
  errors, :mod:`.trainer` the Trainer that runs the end-of-job steps, :mod:`.recipe` one call per recipe,
  :mod:`.quiet` the third-party notices dropped from a run;
- :mod:`.convert_gguf`: ``lightprune convert-gguf`` (:func:`lightprune.export.gguf.convert_to_gguf`), dispatched by
  :mod:`.command` before Lightning is imported.

May import: everything below it; nothing imports it but the package's lazy top level (``lp.run_recipe``).
"""

from __future__ import annotations

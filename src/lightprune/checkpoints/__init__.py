"""Storage: safetensors checkpoints read and written, below every path that reads or writes one.

- `header` (the format's dtypes, a file's header checked against its size), `directory` (config.json,
  the weight files and shard index, [`check_checkpoint`][.directory.check_checkpoint]), `strict` (the strict half of a
  load: integer or quantized weights, unfusable per-expert tensors, transformers' loading report);
- [`reader`][.reader] ([`Checkpoint`][.reader.Checkpoint]: headers once, tensors on demand by positioned reads) and
  `writer` (`SafetensorsWriter`: header first, tensors streamed in);
- `classes` (the transformers class that builds a checkpoint, the in-process resizing subclass, with
  `lightprune.models.resize`'s per-layer expert slots);
- [`skeleton`][.skeleton] ([`Skeleton`][.skeleton.Skeleton]: a checkpoint's model on the meta device, modules loaded and
  released, onto
  the device of `device`, the next layer read ahead by `read_ahead` on a GPU) and [`sequential`][.sequential] (a
  skeleton's model run with one decoder layer in memory, the activations at a layer boundary within a budget);
- `staging` (a checkpoint written beside its target and renamed into place).

May import: models and core; never observe, experts, width, export or anything above.
"""

from __future__ import annotations

from lightprune.core.lazy import lazy_package

_NAMES = {
    "Checkpoint": "lightprune.checkpoints.reader",
    "SafetensorsWriter": "lightprune.checkpoints.writer",
    "Skeleton": "lightprune.checkpoints.skeleton",
    "checkpoint_dtype": "lightprune.checkpoints.skeleton",
    "layer_by_layer": "lightprune.checkpoints.sequential",
    "run_in_lockstep": "lightprune.checkpoints.sequential",
    "run_layer_outer": "lightprune.checkpoints.sequential",
    "check_checkpoint": "lightprune.checkpoints.directory",
    "weight_files": "lightprune.checkpoints.directory",
    "staging_dir": "lightprune.checkpoints.staging",
    "OutputDirError": "lightprune.checkpoints.staging",
}
__all__ = lazy_package(__name__, _NAMES)

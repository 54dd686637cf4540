"""Storage: safetensors checkpoints read and written, below every path that reads or writes one.

- :mod:`.header` (the format's dtypes, a file's header checked against its size), :mod:`.directory` (config.json,
  the weight files and shard index, :func:`check_checkpoint`), :mod:`.strict` (the strict half of a load: integer
  or quantized weights, unfusable per-expert tensors, transformers' loading report);
- :mod:`.reader` (:class:`Checkpoint`: headers once, tensors on demand by positioned reads) and :mod:`.writer`
  (:class:`SafetensorsWriter`: header first, tensors streamed in);
- :mod:`.classes` (the transformers class that builds a checkpoint, the in-process resizing subclass) and
  :mod:`.resize` (per-layer expert slots, torch only: its source is the generated ``modeling_lightprune.py``);
- :mod:`.skeleton` (:class:`Skeleton`: a checkpoint's model on the meta device, modules loaded and released, onto
  the device of :mod:`.device`, the next layer read ahead by :mod:`.read_ahead` on a GPU) and :mod:`.sequential` (a
  skeleton's model run with one decoder layer in memory, the activations at a layer boundary within a budget);
- :mod:`.staging` (a checkpoint written beside its target and renamed into place).

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

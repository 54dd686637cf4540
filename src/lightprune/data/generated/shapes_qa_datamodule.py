"""ShapesQADataModule: the generated Shapes QA set (`lightprune.data.generated.shapes_qa`) as cached JSONL + PNG splits.

The staged search of MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), Alg. 1, uses four
disjoint sets: ``calibration`` (Taylor importance), ``selection`` (the training-free ratio sweep), ``train`` (recovery)
and ``val`` (the full evaluation that retention is measured on). `build_shapes_qa` writes them once into a cache
folder and the datamodule serves them exactly as `ImageTextJsonlDataModule` serves any JSONL:
prompts (system and user turns, images) are -100 in ``labels``, so the loss and the accuracy are on the answer (and its
end-of-turn marker) only, and every batch has ``task_ids`` (indices into ``task_names``).

Cache: ``<root>/shapes_qa/<format>-<digest>/`` with ``{val,selection,calibration,train}.jsonl`` (a split
of 0 rows has no file), one ``<split>-<row>.png`` per image row and ``manifest.json`` (SHA-256 and size
of every file, the generation parameters, rows per split). ``root`` is the given folder, else
``$LIGHTPRUNE_CACHE``, else ``~/.cache/lightprune``; the digest is of the parameters (seed, tasks, image
size, split sizes), so other parameters get another folder. A folder is written under a temporary name
and renamed into place (the default corpus's helpers), so a reader never sees half a cache and
concurrent builders (identical bytes) are safe; a folder that fails its manifest is rebuilt, with a
warning. A JSONL row is ``{"task", "messages", "answer"}`` plus, for image rows, ``"image"`` (the PNG's
name) and ``"shapes"`` (what was drawn: kind, colour, box, grid cell).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightprune.data.generated.qa import GeneratedQADataModule, build_qa_cache, check_split_sizes, qa_cache_dir
from lightprune.data.generated.shapes_qa import (
    SHAPES_QA_TASKS,
    check_image_size,
    check_task_names,
    render_shapes,
    shapes_qa_splits,
)

__all__ = ["SHAPES_QA_FORMAT", "ShapesQADataModule", "build_shapes_qa", "shapes_qa_dir"]

SHAPES_QA_FORMAT = "v1"  # bump when the rows, the pictures or the file layout change
_PROGRESS_MIN_ROWS = 2000


def _params(sizes: dict[str, int], seed: int, tasks: Sequence[str], image_size: int) -> dict[str, Any]:
    check_image_size(image_size)
    return {"seed": seed, "tasks": list(check_task_names(tasks)), "image_size": image_size,
            "sizes": check_split_sizes(sizes)}


def shapes_qa_dir(root: str | os.PathLike | None, sizes: dict[str, int], seed: int = 0,
                  tasks: Sequence[str] = SHAPES_QA_TASKS, image_size: int = 32) -> Path:
    """``<root or $LIGHTPRUNE_CACHE or ~/.cache/lightprune>/shapes_qa/<format>-<digest of the parameters>``."""
    return qa_cache_dir("shapes_qa", SHAPES_QA_FORMAT, root, _params(sizes, seed, tasks, image_size))


def build_shapes_qa(root: str | os.PathLike | None, sizes: dict[str, int], seed: int = 0,
                    tasks: Sequence[str] = SHAPES_QA_TASKS, image_size: int = 32,
                    progress: bool | None = None) -> Path:
    """The cache folder of these parameters, written unless a valid one exists (see the module docstring).

    ``sizes``: rows per split (keys from ``SHAPES_QA_SPLITS``; a missing split has 0 rows).
    ``progress``: show a progress bar while rendering (``None``: from 2000 rows).
    """
    params = _params(sizes, seed, tasks, image_size)
    return build_qa_cache("shapes_qa", SHAPES_QA_FORMAT, root, params,
                          lambda: shapes_qa_splits(params["sizes"], seed, params["tasks"], image_size),
                          lambda row: render_shapes(row.shapes, image_size), label="shapes QA",
                          progress=progress, progress_min_rows=_PROGRESS_MIN_ROWS)


class ShapesQADataModule(GeneratedQADataModule):
    """Shapes QA splits (generated and cached on construction) through a local processor.

    Args:
        processor: local processor directory or object (e.g. ``tiny_mllm_processor("qwen2_5_vl",
            texts=TINY_CORPUS + tuple(shapes_qa_texts()))``).
        root: cache root (see the module docstring).
        n_train, n_val, n_selection, n_calibration: rows of the recovery, evaluation, sweep and
            importance splits (``n_train`` and ``n_val`` >= 1; the others may be 0: no selection set, or
            calibration from ``train`` as in the base class).
        tasks: task families (see `lightprune.data.generated.shapes_qa.SHAPES_QA_TASKS`), in ``task_ids`` order.
        seed: seed of the generated rows and of the train shuffle.
        image_size: side of the square pictures, in pixels (even, >= 24).
        batch_size, max_length, padding_side, mask_prompt, num_workers, progress: as in
            `ImageTextJsonlDataModule`.
    """

    def __init__(self, processor: Any, root: str | None = None, n_train: int = 512, n_val: int = 128,
                 n_selection: int = 64, n_calibration: int = 64, tasks: Sequence[str] = SHAPES_QA_TASKS,
                 seed: int = 0, image_size: int = 32, *, batch_size: int = 8, max_length: int | None = 512,
                 padding_side: str = "right", mask_prompt: bool = True, num_workers: int = 0,
                 progress: bool | None = None):
        sizes = check_split_sizes({"train": n_train, "val": n_val, "selection": n_selection,
                                   "calibration": n_calibration}, required=("train", "val"))
        tasks = check_task_names(tasks)
        folder = build_shapes_qa(root, sizes, seed, tasks, image_size, progress)
        super().__init__(processor, folder, sizes, tasks, seed=seed, batch_size=batch_size, max_length=max_length,
                         padding_side=padding_side, mask_prompt=mask_prompt, num_workers=num_workers,
                         progress=progress)

    check_tasks = staticmethod(check_task_names)

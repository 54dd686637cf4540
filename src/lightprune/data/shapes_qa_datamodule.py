"""ShapesQADataModule: the generated Shapes QA set (:mod:`lightprune.data.shapes_qa`) as cached JSONL + PNG splits.

MWOP's staged search (paper 002, Alg. 1) uses four disjoint sets: ``calibration`` (Taylor importance),
``selection`` (the training-free ratio sweep), ``train`` (recovery) and ``val`` (the full evaluation
that retention is measured on). :func:`build_shapes_qa` writes them once into a cache folder and the
datamodule serves them exactly as :class:`~lightprune.data.ImageTextJsonlDataModule` serves any JSONL:
prompts (system and user turns, images) are -100 in ``labels``, so the loss and the accuracy are on the
answer (and its end-of-turn marker) only, and every batch has ``task_ids`` (indices into ``task_names``).

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

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .default_corpus import MANIFEST, DefaultCorpusError, _build_folder, _check, _write_manifest
from .image_text import ImageTextJsonlDataModule
from .rows import read_jsonl
from .shapes_qa import SHAPES_QA_SPLITS, SHAPES_QA_TASKS, _check_tasks, render_shapes, shapes_qa_splits

__all__ = ["SHAPES_QA_FORMAT", "ShapesQADataModule", "build_shapes_qa", "shapes_qa_dir"]

SHAPES_QA_FORMAT = "v1"  # bump when the rows, the pictures or the file layout change
_PROGRESS_MIN_ROWS = 2000


def _params(sizes: dict[str, int], seed: int, tasks: Sequence[str], image_size: int) -> dict[str, Any]:
    return {"seed": seed, "tasks": list(_check_tasks(tasks)), "image_size": image_size,
            "sizes": {split: int(sizes.get(split, 0)) for split in SHAPES_QA_SPLITS}}


def shapes_qa_dir(root: str | os.PathLike | None, sizes: dict[str, int], seed: int = 0,
                  tasks: Sequence[str] = SHAPES_QA_TASKS, image_size: int = 32) -> Path:
    """``<root or $LIGHTPRUNE_CACHE or ~/.cache/lightprune>/shapes_qa/<format>-<digest of the parameters>``."""
    params = _params(sizes, seed, tasks, image_size)
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
    base = root or os.environ.get("LIGHTPRUNE_CACHE") or Path.home() / ".cache" / "lightprune"
    return Path(base).expanduser() / "shapes_qa" / f"{SHAPES_QA_FORMAT}-{digest}"


def _fill(sizes: dict[str, int], seed: int, tasks: Sequence[str], image_size: int, progress: bool | None):
    def fill(folder: Path) -> None:
        from lightning.pytorch.utilities.rank_zero import rank_zero_only
        from tqdm.auto import tqdm

        splits = shapes_qa_splits(sizes, seed, tasks, image_size)
        total = sum(len(rows) for rows in splits.values())
        show = total >= _PROGRESS_MIN_ROWS if progress is None else progress
        with tqdm(total=total, desc="shapes QA: rendering", disable=not show or rank_zero_only.rank != 0,
                  leave=False) as bar:
            for split, rows in splits.items():
                if not rows:
                    continue
                with (folder / f"{split}.jsonl").open("w", encoding="utf-8", newline="\n") as f:
                    for i, row in enumerate(rows):
                        image = None
                        if row.has_image:
                            image = f"{split}-{i:06d}.png"
                            render_shapes(row.shapes, image_size).save(folder / image, format="PNG")
                        f.write(json.dumps(row.to_json(image), ensure_ascii=False) + "\n")
                        bar.update(1)
        _write_manifest(folder, {"format": SHAPES_QA_FORMAT, "params": _params(sizes, seed, tasks, image_size),
                                 "rows": {split: len(rows) for split, rows in splits.items()}})

    return fill


def build_shapes_qa(root: str | os.PathLike | None, sizes: dict[str, int], seed: int = 0,
                    tasks: Sequence[str] = SHAPES_QA_TASKS, image_size: int = 32,
                    progress: bool | None = None) -> Path:
    """The cache folder of these parameters, written unless a valid one exists (see the module docstring).

    ``sizes``: rows per split (keys from ``SHAPES_QA_SPLITS``; a missing split has 0 rows).
    ``progress``: show a progress bar while rendering (``None``: from 2000 rows).
    """
    params = _params(sizes, seed, tasks, image_size)
    folder = shapes_qa_dir(root, sizes, seed, tasks, image_size)
    expect = {"format": SHAPES_QA_FORMAT, "params": params}
    required = tuple(f"{split}.jsonl" for split, n in params["sizes"].items() if n)
    try:
        _check(folder, expect, required)
    except DefaultCorpusError as e:
        if folder.exists():
            from lightning.pytorch.utilities.rank_zero import rank_zero_warn

            rank_zero_warn(f"rebuilding the shapes QA cache {folder}: {e}")
        _build_folder(folder, _fill(params["sizes"], seed, tasks, image_size, progress), replace=folder.exists())
        _check(folder, expect, required)
    return folder


class ShapesQADataModule(ImageTextJsonlDataModule):
    """Shapes QA splits (generated and cached on construction) through a local processor.

    Args:
        processor: local processor directory or object (e.g. ``tiny_mllm_processor("qwen2_5_vl",
            texts=TINY_CORPUS + tuple(shapes_qa_texts()))``).
        root: cache root (see the module docstring).
        n_train, n_val, n_selection, n_calibration: rows of the recovery, evaluation, sweep and
            importance splits (``n_train`` and ``n_val`` >= 1; the others may be 0: no selection set, or
            calibration from ``train`` as in the base class).
        tasks: task families (see :data:`lightprune.data.shapes_qa.SHAPES_QA_TASKS`), in ``task_ids`` order.
        seed: seed of the generated rows and of the train shuffle.
        image_size: side of the square pictures, in pixels (even, >= 24).
        batch_size, max_length, padding_side, mask_prompt, num_workers, progress: as in
            :class:`~lightprune.data.ImageTextJsonlDataModule`.
    """

    def __init__(self, processor: Any, root: str | None = None, n_train: int = 512, n_val: int = 128,
                 n_selection: int = 64, n_calibration: int = 64, tasks: Sequence[str] = SHAPES_QA_TASKS,
                 seed: int = 0, image_size: int = 32, *, batch_size: int = 8, max_length: int | None = 512,
                 padding_side: str = "right", mask_prompt: bool = True, num_workers: int = 0,
                 progress: bool | None = None):
        sizes = {"train": n_train, "val": n_val, "selection": n_selection, "calibration": n_calibration}
        for name, n in sizes.items():
            low = 1 if name in ("train", "val") else 0
            if not isinstance(n, int) or n < low:
                raise ValueError(f"n_{name} must be an int >= {low}, got {n!r}")
        tasks = list(_check_tasks(tasks))
        self.folder = build_shapes_qa(root, sizes, seed, tasks, image_size, progress)
        files = {split: str(self.folder / f"{split}.jsonl") if n else None for split, n in sizes.items()}
        super().__init__(processor, calibration=files["calibration"], train=files["train"], val=files["val"],
                         max_length=max_length, batch_size=batch_size, padding_side=padding_side,
                         mask_prompt=mask_prompt, seed=seed, num_workers=num_workers, progress=progress,
                         task_names=tasks)
        self.selection_path = Path(files["selection"]) if files["selection"] else None

    def dataset(self, split: str):
        """The split's dataset; besides the base splits, ``selection`` (``None`` when it has no rows)."""
        if split != "selection":
            return super().dataset(split)
        if self.selection_path is None:
            return None
        if "selection" not in self._datasets:
            rows = read_jsonl(self.selection_path, allow_images=True, progress=self.progress, desc="selection")
            self._datasets["selection"] = self._dataset_from_rows("selection", rows)
        return self._datasets["selection"]

    def selection_dataloader(self):
        """Selection batches in file order (for a training-free sweep); ``[]`` when the split has no rows."""
        return self._loader("selection", shuffle=False)

    def rows(self, split: str) -> list[dict[str, Any]]:
        """The JSONL rows of ``split`` (task, messages, answer, image, shapes), in file (= batch) order."""
        if split not in SHAPES_QA_SPLITS:
            raise ValueError(f"split must be one of {SHAPES_QA_SPLITS}, got {split!r}")
        path = self.folder / f"{split}.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    @property
    def manifest(self) -> dict[str, Any]:
        """The cache folder's manifest (parameters, rows per split, file digests)."""
        return json.loads((self.folder / MANIFEST).read_text())

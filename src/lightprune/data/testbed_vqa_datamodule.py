"""TestbedVQADataModule: the Testbed VQA set (:mod:`lightprune.data.testbed_vqa`) as cached JSONL + PNG splits.

Four disjoint splits as in :class:`~lightprune.data.ShapesQADataModule`: ``val``, ``selection``,
``calibration`` and ``train``; prompts are -100 in ``labels`` (loss and accuracy on the answer and its
end-of-turn marker only), every batch has ``task_ids`` (indices into ``task_names``), and
:meth:`TestbedVQADataModule.dataloader` serves one split restricted to some task families (calibrating
on one image source at a time: digits, or charts).

Cache: ``<root>/testbed_vqa/<format>-<digest>/`` with ``{val,selection,calibration,train}.jsonl`` (a
split of 0 rows has no file), one ``<split>-<row>.png`` per image row and ``manifest.json`` (SHA-256 and
size of every file, the generation parameters, rows per split). ``root`` is the given folder, else
``$LIGHTPRUNE_CACHE``, else ``~/.cache/lightprune``; the digest is of the parameters (seed, tasks, image
size, split sizes, and the sources the rows depend on: the Python documentation's corpus version for
``text``, matplotlib's version for charts), so other parameters get another folder. The folder is
written under a temporary name and renamed into place (the default corpus's helpers); a folder that
fails its manifest is rebuilt, with a warning. A JSONL row is ``{"task", "messages", "answer"}`` plus
``"image"`` (the PNG's name) for image rows and what the row shows: ``"digit"`` (the index into
``sklearn.datasets.load_digits()``), ``"bars"`` (``[{"color", "height"}]``, left to right) or
``"topic"`` (a text row's documentation topic).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from .default_corpus import MANIFEST, DefaultCorpusError, _build_folder, _check, _write_manifest
from .image_text import ImageTextJsonlDataModule, LazyImageTextDataset
from .rows import read_jsonl
from .testbed_vqa import (TESTBED_VQA_SPLITS, TESTBED_VQA_TASKS, check_image_size, check_tasks, render_row,
                          testbed_vqa_splits)

__all__ = ["TESTBED_VQA_FORMAT", "TestbedVQADataModule", "build_testbed_vqa", "testbed_vqa_dir"]

TESTBED_VQA_FORMAT = "v1"  # bump when the rows, the pictures or the file layout change
_PROGRESS_MIN_ROWS = 1000


def _params(sizes: dict[str, int], seed: int, tasks: Sequence[str], image_size: int) -> dict[str, Any]:
    tasks = check_tasks(tasks)
    check_image_size(image_size)
    for split, n in sizes.items():
        if split not in TESTBED_VQA_SPLITS:
            raise ValueError(f"unknown split {split!r}; choose from {TESTBED_VQA_SPLITS}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"n_{split} must be an int >= 0, got {n!r}")
    sources = {}
    if "text" in tasks:
        from .default_corpus import corpus_version

        sources["python_docs"] = corpus_version()
    if any(t.startswith("chart_") for t in tasks):
        import matplotlib

        sources["matplotlib"] = matplotlib.__version__
    return {"seed": seed, "tasks": list(tasks), "image_size": image_size,
            "sizes": {split: int(sizes.get(split, 0)) for split in TESTBED_VQA_SPLITS}, "sources": sources}


def _folder(root: str | os.PathLike | None, params: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
    base = root or os.environ.get("LIGHTPRUNE_CACHE") or Path.home() / ".cache" / "lightprune"
    return Path(base).expanduser() / "testbed_vqa" / f"{TESTBED_VQA_FORMAT}-{digest}"


def testbed_vqa_dir(root: str | os.PathLike | None, sizes: dict[str, int], seed: int = 0,
                    tasks: Sequence[str] = TESTBED_VQA_TASKS, image_size: int = 32) -> Path:
    """``<root or $LIGHTPRUNE_CACHE or ~/.cache/lightprune>/testbed_vqa/<format>-<digest of the parameters>``."""
    return _folder(root, _params(sizes, seed, tasks, image_size))


def _fill(params: dict[str, Any], progress: bool | None):
    def fill(folder: Path) -> None:
        from lightning.pytorch.utilities.rank_zero import rank_zero_only
        from tqdm.auto import tqdm

        splits = testbed_vqa_splits(params["sizes"], params["seed"], params["tasks"])
        total = sum(len(rows) for rows in splits.values())
        show = total >= _PROGRESS_MIN_ROWS if progress is None else progress
        with tqdm(total=total, desc="testbed VQA: rendering", disable=not show or rank_zero_only.rank != 0,
                  leave=False) as bar:
            for split, rows in splits.items():
                if not rows:
                    continue
                with (folder / f"{split}.jsonl").open("w", encoding="utf-8", newline="\n") as f:
                    for i, row in enumerate(rows):
                        image = None
                        if row.has_image:
                            image = f"{split}-{i:06d}.png"
                            render_row(row, params["image_size"]).save(folder / image, format="PNG")
                        f.write(json.dumps(row.to_json(image), ensure_ascii=False) + "\n")
                        bar.update(1)
        _write_manifest(folder, {"format": TESTBED_VQA_FORMAT, "params": params,
                                 "rows": {split: len(rows) for split, rows in splits.items()}})

    return fill


def build_testbed_vqa(root: str | os.PathLike | None, sizes: dict[str, int], seed: int = 0,
                      tasks: Sequence[str] = TESTBED_VQA_TASKS, image_size: int = 32,
                      progress: bool | None = None) -> Path:
    """The cache folder of these parameters, written unless a valid one exists (see the module docstring).

    ``sizes``: rows per split (keys from ``TESTBED_VQA_SPLITS``; a missing split has 0 rows).
    ``progress``: show a progress bar while rendering (``None``: from 1000 rows).
    """
    params = _params(sizes, seed, tasks, image_size)
    folder = _folder(root, params)
    expect = {"format": TESTBED_VQA_FORMAT, "params": params}
    required = tuple(f"{split}.jsonl" for split, n in params["sizes"].items() if n)
    try:
        _check(folder, expect, required)
    except DefaultCorpusError as e:
        if folder.exists():
            from lightning.pytorch.utilities.rank_zero import rank_zero_warn

            rank_zero_warn(f"rebuilding the testbed VQA cache {folder}: {e}")
        _build_folder(folder, _fill(params, progress), replace=folder.exists())
        _check(folder, expect, required)
    return folder


class TestbedVQADataModule(ImageTextJsonlDataModule):
    """Testbed VQA splits (generated and cached on construction) through a local processor.

    Args:
        processor: local processor directory or object, or ``"tiny:<family>"`` (see
            :func:`~lightprune.data.load_processor`); a tokenizer trained on :func:`testbed_vqa_texts`
            gives the questions and answers whole-word tokens: ``tiny_mllm_processor("qwen3_vl_moe",
            texts=TINY_CORPUS + tuple(testbed_vqa_texts()))``.
        root: cache root (see the module docstring).
        n_train, n_val, n_selection, n_calibration: rows of the recovery, evaluation, sweep and
            importance splits (``n_train`` and ``n_val`` >= 1; the others may be 0: no selection set, or
            calibration from ``train`` as in the base class).
        tasks: task families (see :data:`lightprune.data.testbed_vqa.TESTBED_VQA_TASKS`), in ``task_ids`` order.
        seed: seed of the generated rows and of the train shuffle.
        image_size: side of the square pictures, in pixels (>= 16).
        batch_size, max_length, padding_side, mask_prompt, num_workers, progress: as in
            :class:`~lightprune.data.ImageTextJsonlDataModule`.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, processor: Any, root: str | None = None, n_train: int = 512, n_val: int = 128,
                 n_selection: int = 64, n_calibration: int = 64, tasks: Sequence[str] = TESTBED_VQA_TASKS,
                 seed: int = 0, image_size: int = 32, *, batch_size: int = 8, max_length: int | None = 512,
                 padding_side: str = "right", mask_prompt: bool = True, num_workers: int = 0,
                 progress: bool | None = None):
        sizes = {"train": n_train, "val": n_val, "selection": n_selection, "calibration": n_calibration}
        for name, n in sizes.items():
            low = 1 if name in ("train", "val") else 0
            if not isinstance(n, int) or isinstance(n, bool) or n < low:
                raise ValueError(f"n_{name} must be an int >= {low}, got {n!r}")
        tasks = list(check_tasks(tasks))
        self.folder = build_testbed_vqa(root, sizes, seed, tasks, image_size, progress)
        files = {split: str(self.folder / f"{split}.jsonl") if n else None for split, n in sizes.items()}
        super().__init__(processor, calibration=files["calibration"], train=files["train"], val=files["val"],
                         max_length=max_length, batch_size=batch_size, padding_side=padding_side,
                         mask_prompt=mask_prompt, seed=seed, num_workers=num_workers, progress=progress,
                         task_names=tasks)
        self.selection_path = Path(files["selection"]) if files["selection"] else None
        self._task_subsets: dict[tuple[str, tuple[str, ...]], LazyImageTextDataset | None] = {}

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

    def dataloader(self, split: str, tasks: Sequence[str] | str | None = None):
        """Batches of ``split``'s rows of the task families ``tasks`` (default: all), in file order, unshuffled;
        ``task_ids`` still index ``task_names``. ``[]`` when no row of the split is of those tasks.
        ``calibration`` with no rows of its own reads ``train``, as :meth:`calibration_dataloader` does."""
        if split not in TESTBED_VQA_SPLITS:
            raise ValueError(f"split must be one of {TESTBED_VQA_SPLITS}, got {split!r}")
        wanted = tuple(self.task_names) if tasks is None else check_tasks(tasks)
        missing = [t for t in wanted if t not in self.task_names]
        if missing:
            raise ValueError(f"task {missing[0]!r} is not one of this datamodule's tasks {self.task_names}")
        key = (split, wanted)
        if key not in self._task_subsets:
            full = self.dataset(split)
            keep = [] if full is None else [i for i, t in enumerate(full.task_ids)
                                            if self.task_names[t] in wanted]
            self._task_subsets[key] = LazyImageTextDataset([full.rows[i] for i in keep], self.encoder,
                                                           [full.task_ids[i] for i in keep]) if keep else None
        dataset = self._task_subsets[key]
        if dataset is None:
            return []
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=False, collate_fn=self._collator(),
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0)

    def rows(self, split: str) -> list[dict[str, Any]]:
        """The JSONL rows of ``split`` (task, messages, answer, image, digit / bars / topic), in file order."""
        if split not in TESTBED_VQA_SPLITS:
            raise ValueError(f"split must be one of {TESTBED_VQA_SPLITS}, got {split!r}")
        path = self.folder / f"{split}.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    @property
    def manifest(self) -> dict[str, Any]:
        """The cache folder's manifest (parameters, rows per split, file digests)."""
        return json.loads((self.folder / MANIFEST).read_text())


testbed_vqa_dir.__test__ = False  # type: ignore[attr-defined]  # not a pytest test when imported by one

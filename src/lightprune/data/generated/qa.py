"""Generated image question-answering sets, cached as JSONL + PNG splits, and their datamodule base.

Shapes QA (`lightprune.data.generated.shapes_qa`) and Testbed VQA (`lightprune.data.generated.testbed_vqa`) are both
drawn from a seeded stream into the splits `QA_SPLITS` (``val``, ``selection``, ``calibration``,
``train``) and served the same way; this module holds what they share.

Cache: ``<root>/<kind>/<format>-<digest of the parameters>/`` with ``<split>.jsonl`` per non-empty
split, one ``<split>-<row>.png`` per image row and ``manifest.json`` (SHA-256 and size of every file, the
parameters, rows per split). ``root`` is the given folder, else ``$LIGHTPRUNE_CACHE``, else
``~/.cache/lightprune``. The folder is written under a temporary name and renamed into place (the default
corpus's helpers), so a reader never sees half a cache and concurrent builders (identical bytes) are safe;
a folder that fails its manifest is rebuilt, with a warning. Rows are objects with ``has_image`` and
``to_json(image_name)``.

`GeneratedQADataModule` serves a cache folder like `ImageTextJsonlDataModule`
serves any JSONL (prompts -100 in ``labels``, ``task_ids`` per batch) and adds the ``selection`` split, a
per-task `dataloader` and the raw `rows`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from lightprune.core.jsonio import parse_json
from lightprune.data.cache import MANIFEST, CacheError, build_folder, check_folder, write_manifest
from lightprune.data.image_text import ImageTextJsonlDataModule, LazyImageTextDataset
from lightprune.data.rows import read_jsonl

__all__ = ["QA_SPLITS", "GeneratedQADataModule", "build_qa_cache", "check_split_sizes", "qa_cache_dir"]

# stream order: evaluation first, so that the number of training rows does not move the evaluation rows
QA_SPLITS: tuple[str, ...] = ("val", "selection", "calibration", "train")


def check_split_sizes(sizes: Mapping[str, int], required: Sequence[str] = ()) -> dict[str, int]:
    """``{split: rows}`` over `QA_SPLITS` (a missing split: 0); ints >= 0, and >= 1 for ``required``."""
    for split, n in sizes.items():
        if split not in QA_SPLITS:
            raise ValueError(f"unknown split {split!r}; choose from {QA_SPLITS}")
        low = 1 if split in required else 0
        if not isinstance(n, int) or isinstance(n, bool) or n < low:
            raise ValueError(f"n_{split} must be an int >= {low}, got {n!r}")
    return {split: int(sizes.get(split, 0)) for split in QA_SPLITS}


def qa_cache_dir(kind: str, fmt: str, root: str | os.PathLike | None, params: Mapping[str, Any]) -> Path:
    """``<root or $LIGHTPRUNE_CACHE or ~/.cache/lightprune>/<kind>/<fmt>-<digest of params>``."""
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
    base = root or os.environ.get("LIGHTPRUNE_CACHE") or Path.home() / ".cache" / "lightprune"
    return Path(base).expanduser() / kind / f"{fmt}-{digest}"


def _fill(label: str, fmt: str, params: Mapping[str, Any], make_splits: Callable[[], Mapping[str, Sequence[Any]]],
          render: Callable[[Any], Any], show: Callable[[int], bool]):
    def fill(folder: Path) -> None:
        from lightning.pytorch.utilities.rank_zero import rank_zero_only
        from tqdm.auto import tqdm

        splits = make_splits()
        total = sum(len(rows) for rows in splits.values())
        with tqdm(total=total, desc=f"{label}: rendering", disable=not show(total) or rank_zero_only.rank != 0,
                  leave=False) as bar:
            for split, rows in splits.items():
                if not rows:
                    continue
                with (folder / f"{split}.jsonl").open("w", encoding="utf-8", newline="\n") as f:
                    for i, row in enumerate(rows):
                        image = None
                        if row.has_image:
                            image = f"{split}-{i:06d}.png"
                            render(row).save(folder / image, format="PNG")
                        f.write(json.dumps(row.to_json(image), ensure_ascii=False) + "\n")
                        bar.update(1)
        write_manifest(folder, {"format": fmt, "params": params,
                                 "rows": {split: len(rows) for split, rows in splits.items()}})

    return fill


def build_qa_cache(kind: str, fmt: str, root: str | os.PathLike | None, params: Mapping[str, Any],
                   make_splits: Callable[[], Mapping[str, Sequence[Any]]], render: Callable[[Any], Any], *,
                   label: str, progress: bool | None, progress_min_rows: int) -> Path:
    """The cache folder of ``params`` (``params["sizes"]``: rows per split), written unless a valid one exists.

    ``make_splits()`` draws ``{split: rows}``, ``render(row)`` a row's PIL picture. ``progress``: a bar while
    rendering (``None``: from ``progress_min_rows`` rows).
    """
    folder = qa_cache_dir(kind, fmt, root, params)
    expect = {"format": fmt, "params": params}
    required = tuple(f"{split}.jsonl" for split, n in params["sizes"].items() if n)
    try:
        check_folder(folder, expect, required)
    except CacheError as e:
        if folder.exists():
            from lightning.pytorch.utilities.rank_zero import rank_zero_warn

            rank_zero_warn(f"rebuilding the {label} cache {folder}: {e}")

        def show(total: int) -> bool:
            return total >= progress_min_rows if progress is None else progress

        build_folder(folder, _fill(label, fmt, params, make_splits, render, show), replace=folder.exists())
        check_folder(folder, expect, required)
    return folder


class GeneratedQADataModule(ImageTextJsonlDataModule):
    """The splits of a generated QA cache folder through a local processor (see the module docstring).

    ``sizes``: rows per split as written (a split of 0 rows has no file: no selection set, or calibration
    from ``train`` as in the base class); ``tasks``: the task families in ``task_ids`` order; the other
    arguments as in `ImageTextJsonlDataModule`.
    """

    def __init__(self, processor: Any, folder: Path, sizes: Mapping[str, int], tasks: Sequence[str], *, seed: int,
                 batch_size: int, max_length: int | None, padding_side: str, mask_prompt: bool, num_workers: int,
                 progress: bool | None):
        self.folder = Path(folder)
        files = {split: str(self.folder / f"{split}.jsonl") if sizes.get(split) else None for split in QA_SPLITS}
        super().__init__(processor, calibration=files["calibration"], train=files["train"], val=files["val"],
                         max_length=max_length, batch_size=batch_size, padding_side=padding_side,
                         mask_prompt=mask_prompt, seed=seed, num_workers=num_workers, progress=progress,
                         task_names=list(tasks))
        self.selection_path = Path(files["selection"]) if files["selection"] else None
        self._task_subsets: dict[tuple[str, tuple[str, ...]], LazyImageTextDataset | None] = {}

    @staticmethod
    def check_tasks(tasks: Sequence[str] | str) -> tuple[str, ...]:
        """Task names as a tuple, checked against the set's families (subclasses name their own)."""
        return (tasks,) if isinstance(tasks, str) else tuple(tasks)

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
        ``calibration`` with no rows of its own reads ``train``, as `calibration_dataloader` does."""
        if split not in QA_SPLITS:
            raise ValueError(f"split must be one of {QA_SPLITS}, got {split!r}")
        wanted = tuple(self.task_names) if tasks is None else self.check_tasks(tasks)
        missing = [t for t in wanted if t not in self.task_names]
        if missing:
            raise ValueError(f"task {missing[0]!r} is not one of this datamodule's tasks {self.task_names}")
        key = (split, wanted)
        if key not in self._task_subsets:
            full = self.dataset(split)
            keep = [] if full is None else [i for i, t in enumerate(full.task_ids) if self.task_names[t] in wanted]
            self._task_subsets[key] = LazyImageTextDataset([full.rows[i] for i in keep], self.encoder,
                                                           [full.task_ids[i] for i in keep]) if keep else None
        dataset = self._task_subsets[key]
        if dataset is None:
            return []
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=False, collate_fn=self._collator(),
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0)

    def rows(self, split: str) -> list[dict[str, Any]]:
        """The JSONL rows of ``split`` (task, messages, answer, image and what the picture shows), in file order."""
        if split not in QA_SPLITS:
            raise ValueError(f"split must be one of {QA_SPLITS}, got {split!r}")
        path = self.folder / f"{split}.jsonl"
        if not path.is_file():
            return []
        lines = path.read_text(encoding="utf-8").splitlines()
        return [parse_json(line, f"{path}:{number}") for number, line in enumerate(lines, start=1) if line.strip()]

    @property
    def manifest(self) -> dict[str, Any]:
        """The cache folder's manifest (parameters, rows per split, file digests)."""
        path = self.folder / MANIFEST
        return parse_json(path.read_text(), str(path))

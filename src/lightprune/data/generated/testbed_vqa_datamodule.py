"""TestbedVQADataModule: the Testbed VQA set (`lightprune.data.generated.testbed_vqa`) as cached JSONL + PNG splits.

Four disjoint splits as in `ShapesQADataModule`: ``val``, ``selection``,
``calibration`` and ``train``; prompts are -100 in ``labels`` (loss and accuracy on the answer and its
end-of-turn marker only), every batch has ``task_ids`` (indices into ``task_names``), and
`TestbedVQADataModule.dataloader` serves one split restricted to some task families (calibrating
on one image source at a time: digits, or charts).

Cache: ``<root>/testbed_vqa/<format>-<digest>/`` with ``{val,selection,calibration,train}.jsonl`` (a
split of 0 rows has no file), one ``<split>-<row>.png`` per image row and ``manifest.json`` (SHA-256 and
size of every file, the generation parameters, rows per split). ``root`` is the given folder, else
``$LIGHTPRUNE_CACHE``, else ``~/.cache/lightprune``; the digest is of the parameters (seed, tasks, image
size, the canvas and its placement when set, split sizes, and the sources the rows depend on: the Python
documentation's corpus version for ``text``, matplotlib's version for charts), so other parameters get another
folder. The folder is
written under a temporary name and renamed into place (the default corpus's helpers); a folder that
fails its manifest is rebuilt, with a warning. A JSONL row is ``{"task", "messages", "answer"}`` plus
``"image"`` (the PNG's name) for image rows and what the row shows: ``"digit"`` (the index into
``sklearn.datasets.load_digits()``), ``"bars"`` (``[{"color", "height"}]``, left to right) or
``"topic"`` (a text row's documentation topic).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightprune.data.default_corpus import corpus_version
from lightprune.data.generated.qa import GeneratedQADataModule, build_qa_cache, check_split_sizes, qa_cache_dir
from lightprune.data.generated.testbed_vqa import TESTBED_VQA_TASKS, check_tasks, testbed_vqa_splits
from lightprune.data.generated.testbed_vqa_pictures import check_canvas, check_image_size, render_row

__all__ = ["TESTBED_VQA_FORMAT", "TestbedVQADataModule", "build_testbed_vqa", "testbed_vqa_dir"]

TESTBED_VQA_FORMAT = "v2"  # bump when the rows, the pictures or the file layout change
_PROGRESS_MIN_ROWS = 1000


def _params(sizes: dict[str, int], seed: int, tasks: Sequence[str], image_size: int,
            canvas: int | None = None, canvas_place: str = "random") -> dict[str, Any]:
    tasks = check_tasks(tasks)
    check_image_size(image_size)
    check_canvas(canvas, image_size, canvas_place)
    sizes = check_split_sizes(sizes)
    sources = {}
    if "text" in tasks:
        sources["python_docs"] = corpus_version()
    if any(t.startswith("chart_") for t in tasks):
        import matplotlib

        sources["matplotlib"] = matplotlib.__version__
    params = {"seed": seed, "tasks": list(tasks), "image_size": image_size, "sizes": sizes, "sources": sources}
    if canvas is not None:  # only when set: the folders written before the canvas keep their digest
        params["canvas"] = canvas
        if canvas_place != "random":
            params["canvas_place"] = canvas_place
    return params


def testbed_vqa_dir(root: str | os.PathLike | None, sizes: dict[str, int], seed: int = 0,
                    tasks: Sequence[str] = TESTBED_VQA_TASKS, image_size: int = 32, canvas: int | None = None,
                    canvas_place: str = "random") -> Path:
    """``<root or $LIGHTPRUNE_CACHE or ~/.cache/lightprune>/testbed_vqa/<format>-<digest of the parameters>``."""
    return qa_cache_dir("testbed_vqa", TESTBED_VQA_FORMAT, root,
                        _params(sizes, seed, tasks, image_size, canvas, canvas_place))


def build_testbed_vqa(root: str | os.PathLike | None, sizes: dict[str, int], seed: int = 0,
                      tasks: Sequence[str] = TESTBED_VQA_TASKS, image_size: int = 32,
                      progress: bool | None = None, canvas: int | None = None,
                      canvas_place: str = "random") -> Path:
    """The cache folder of these parameters, written unless a valid one exists (see the module docstring).

    ``sizes``: rows per split (keys from ``TESTBED_VQA_SPLITS``; a missing split has 0 rows).
    ``progress``: show a progress bar while rendering (``None``: from 1000 rows). ``canvas``: the pictures on a
    larger square of noise, placed by ``canvas_place``
    (`place_on_canvas`).
    """
    params = _params(sizes, seed, tasks, image_size, canvas, canvas_place)
    return build_qa_cache("testbed_vqa", TESTBED_VQA_FORMAT, root, params,
                          lambda: testbed_vqa_splits(params["sizes"], params["seed"], params["tasks"]),
                          lambda row: render_row(row, params["image_size"], canvas, canvas_place),
                          label="testbed VQA",
                          progress=progress, progress_min_rows=_PROGRESS_MIN_ROWS)


class TestbedVQADataModule(GeneratedQADataModule):
    """Testbed VQA splits (generated and cached on construction) through a local processor.

    Args:
        processor: local processor directory or object, or ``"tiny:<family>"`` (see
            `load_processor`); a tokenizer trained on `testbed_vqa_texts`
            gives the questions and answers whole-word tokens: ``tiny_mllm_processor("qwen3_vl_moe",
            texts=TINY_CORPUS + tuple(testbed_vqa_texts()))``.
        root: cache root (see the module docstring).
        n_train, n_val, n_selection, n_calibration: rows of the recovery, evaluation, sweep and
            importance splits (``n_train`` and ``n_val`` >= 1; the others may be 0: no selection set, or
            calibration from ``train`` as in the base class).
        tasks: task families (see `lightprune.data.generated.testbed_vqa.TESTBED_VQA_TASKS`), in ``task_ids`` order.
        seed: seed of the generated rows and of the train shuffle.
        image_size: side of the square pictures, in pixels (>= 16).
        canvas: None, or the side of a square of uninformative noise each picture is pasted onto (>= image_size).
        canvas_place: where on the canvas: ``"random"`` (drawn from the row) or ``"centre"``.
        batch_size, max_length, padding_side, mask_prompt, num_workers, progress: as in
            `ImageTextJsonlDataModule`.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, processor: Any, root: str | None = None, n_train: int = 512, n_val: int = 128,
                 n_selection: int = 64, n_calibration: int = 64, tasks: Sequence[str] = TESTBED_VQA_TASKS,
                 seed: int = 0, image_size: int = 32, canvas: int | None = None, canvas_place: str = "random", *,
                 batch_size: int = 8, max_length: int | None = 512,
                 padding_side: str = "right", mask_prompt: bool = True, num_workers: int = 0,
                 progress: bool | None = None):
        sizes = check_split_sizes({"train": n_train, "val": n_val, "selection": n_selection,
                                   "calibration": n_calibration}, required=("train", "val"))
        tasks = check_tasks(tasks)
        folder = build_testbed_vqa(root, sizes, seed, tasks, image_size, progress, canvas, canvas_place)
        super().__init__(processor, folder, sizes, tasks, seed=seed, batch_size=batch_size, max_length=max_length,
                         padding_side=padding_side, mask_prompt=mask_prompt, num_workers=num_workers,
                         progress=progress)

    check_tasks = staticmethod(check_tasks)


testbed_vqa_dir.__test__ = False  # type: ignore[attr-defined]  # not a pytest test when imported by one

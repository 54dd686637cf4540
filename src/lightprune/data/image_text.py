"""ImageTextJsonlDataModule: image+text (and text-only) batches for MLLMs from local JSONL files.

Lines are ``{"image": "cat.png", "messages": [...]}`` (or ``"images": [...]``; paths relative
to the JSONL file's folder) mixed with the text-only shapes of `lightprune.data.rows`.
Rows are read and checked when a split is first used (every image must exist; every
conversation must render); images are opened and processed when a batch is drawn, so
memory holds one batch of pixels at a time.

The processor is a local directory (``AutoProcessor.from_pretrained(path,
local_files_only=True)``; nothing is downloaded) or a processor object. The contract it must
meet (transformers' Qwen3-VL, Qwen2-VL, LLaVA and InternVL processors do):

- ``processor(text=[str], images=[PIL.Image, ...] | None, return_tensors="pt",
  add_special_tokens=False)`` returns a mapping with ``input_ids`` of shape (1, L), optionally
  ``attention_mask`` / ``mm_token_type_ids`` / ``token_type_ids`` of shape (1, L), and image
  tensors whose dim 0 indexes images or patches (``pixel_values``, ``image_grid_thw``, ...), the
  image placeholders in the text already expanded to the image's tokens;
- ``processor.tokenizer`` pads (``pad_token_id``, else ``eos_token_id``);
- a chat template on the processor or its tokenizer for ``messages`` rows, rendering
  ``{"type": "image"}`` content parts as the image placeholder.

Each segment of a row (see `lightprune.data.segments`) goes through the processor with
its own images and the outputs are concatenated: per-token tensors along the sequence, image
tensors along dim 0. Image tokens (``processor.image_token_id`` / ``video_token_id``, or
``mm_token_type_ids != 0``) never carry labels. ``max_length`` truncation that would cut
image tokens is an error naming the row (the model needs every image token of an image).

Task families: a row's optional ``"task"`` (see `lightprune.data.rows`) becomes ``task_ids``, a
LongTensor ``[B]`` of indices into the datamodule's ``task_names`` (rows without a task are
``"default"``). ``task_names`` is given, or else the sorted task names of the rows of every given file;
when no row has a task and none were given, ``task_names`` is ``None`` and batches have no ``task_ids``
(they stay exactly what the model takes). ``task_ids`` is not a model input: `MoECausalLM` drops
it before calling the model, and callbacks read it from the batch (per-task metrics, sampling).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from lightprune.core.jsonio import parse_json
from lightprune.core.sources import resolve_checkpoint
from lightprune.data.base import JsonlDataModule
from lightprune.data.collate import TOKEN_KEYS, Collator
from lightprune.data.generated.shapes_qa import shapes_qa_texts
from lightprune.data.rows import DEFAULT_TASK, Row
from lightprune.data.segments import chat_renderer, row_segments, special_affixes
from lightprune.data.text import check_tokenizer_dir, pad_token_id
from lightprune.data.tiny_processor import TINY_CORPUS, TINY_PROCESSOR_FAMILIES, tiny_mllm_processor

__all__ = ["ImageTextJsonlDataModule", "load_processor"]


TINY_PROCESSOR_PREFIX = "tiny:"


def load_processor(processor: Any):
    """A processor object, one loaded from a local directory (never from a hub), or ``"tiny:<family>"``:
    the local processor of a tiny model (`lightprune.data.tiny_processor.tiny_mllm_processor`), its tokenizer
    trained on the built-in corpus and the Shapes QA vocabulary (what a config file can name)."""
    if isinstance(processor, str) and processor.startswith(TINY_PROCESSOR_PREFIX):
        family = processor[len(TINY_PROCESSOR_PREFIX):]
        if family not in TINY_PROCESSOR_FAMILIES:
            raise ValueError(f"processor {processor!r}: tiny processors exist for {list(TINY_PROCESSOR_FAMILIES)}")
        return tiny_mllm_processor(family, texts=TINY_CORPUS + tuple(shapes_qa_texts()))
    if isinstance(processor, (str, os.PathLike)):
        path = resolve_checkpoint(str(Path(processor).expanduser()))  # a checkpoint source's name too
        if not path.is_dir():
            raise FileNotFoundError(f"processor directory {str(path)!r} does not exist (lightprune loads "
                                    "processors from local directories only; nothing is downloaded)")
        from transformers import AutoProcessor

        check_tokenizer_dir(path, "processor")
        try:
            return AutoProcessor.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
        except Exception as err:  # noqa: BLE001 - every loader failure is the same answer: name the folder
            raise ValueError(f"processor directory {str(path)!r} cannot be loaded: {type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else ''}") from None
    if not callable(processor) or getattr(processor, "tokenizer", None) is None:
        raise TypeError(f"processor must be a local directory or a processor object with a tokenizer, "
                        f"got {type(processor).__name__}")
    return processor


def _open_image(path: Path, source: str):
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.load()
            return image.convert("RGB")
    except FileNotFoundError:
        raise FileNotFoundError(f"{source}: image {str(path)!r} not found") from None
    except Exception as e:  # PIL raises several types for unreadable files
        raise ValueError(f"{source}: cannot read image {str(path)!r}: {e}") from e


class RowEncoder:
    """Turns a `Row` into one sample (a dict of tensors) with the processor; picklable."""

    def __init__(self, processor, mask_prompt: bool, max_length: int | None, add_eos: bool):
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.mask_prompt = mask_prompt
        self.max_length = max_length
        self.add_eos = add_eos
        self.render = chat_renderer(processor, "processor") or chat_renderer(self.tokenizer, "tokenizer")
        self.prefix, self.suffix = special_affixes(self.tokenizer)
        self.media_ids = sorted({int(i) for i in (getattr(processor, "image_token_id", None),
                                                  getattr(processor, "video_token_id", None)) if i is not None})

    def segments(self, row: Row):
        return row_segments(row, self.render, self.mask_prompt)

    def _affix(self, ids: list[int], trainable: bool, keys) -> dict[str, torch.Tensor]:
        t = torch.tensor(ids, dtype=torch.long)
        piece = {k: torch.zeros_like(t) for k in keys if k not in ("input_ids", "labels", "attention_mask")}
        piece.update(input_ids=t, attention_mask=torch.ones_like(t),
                     labels=t.clone() if trainable else torch.full_like(t, -100))
        return piece

    def __call__(self, row: Row) -> dict[str, torch.Tensor]:
        segments, affixes = self.segments(row)
        pieces: list[dict[str, torch.Tensor]] = []
        media: list[torch.Tensor] = []
        for segment in segments:
            images = [_open_image(p, row.source) for p in segment.images]
            out = self.processor(text=[segment.text], images=images or None, return_tensors="pt",
                                 add_special_tokens=False)
            piece = {}
            for key, value in out.items():
                if not isinstance(value, torch.Tensor):
                    continue
                piece[key] = value[0].long() if key in TOKEN_KEYS else value
            ids = piece["input_ids"]
            piece.setdefault("attention_mask", torch.ones_like(ids))
            is_media = torch.isin(ids, torch.tensor(self.media_ids, dtype=torch.long))
            if "mm_token_type_ids" in piece:
                is_media |= piece["mm_token_type_ids"] != 0
            if segment.images and not self.media_ids and "mm_token_type_ids" not in piece:
                is_media[:] = True  # no way to tell image tokens apart: guard the whole segment
            labels = ids.clone() if segment.trainable else torch.full_like(ids, -100)
            piece["labels"] = labels.masked_fill(is_media, -100)
            pieces.append(piece)
            media.append(is_media)
        keys = {k for p in pieces for k in p if k in TOKEN_KEYS}
        if affixes:
            tail = list(self.suffix)
            eos = getattr(self.tokenizer, "eos_token_id", None)
            end = tail[-1] if tail else (int(pieces[-1]["input_ids"][-1]) if pieces and len(pieces[-1]["input_ids"])
                                         else None)
            if self.add_eos and eos is not None and end != eos:
                tail.append(eos)
            if self.prefix:
                pieces.insert(0, self._affix(self.prefix, False, keys))
                media.insert(0, torch.zeros(len(self.prefix), dtype=torch.bool))
            if tail:
                pieces.append(self._affix(tail, True, keys))
                media.append(torch.zeros(len(tail), dtype=torch.bool))
        sample: dict[str, torch.Tensor] = {}
        for key in keys:
            sample[key] = torch.cat([p[key] if key in p else torch.zeros_like(p["input_ids"]) for p in pieces])
        for key in sorted({k for p in pieces for k in p if k not in TOKEN_KEYS}):
            sample[key] = torch.cat([p[key] for p in pieces if key in p], dim=0)
        is_media = torch.cat(media)
        length = len(sample["input_ids"])
        if self.max_length is not None and length > self.max_length:
            if is_media[self.max_length:].any():
                last = int(is_media.nonzero().max()) + 1
                raise ValueError(f"{row.source}: image tokens reach position {last} of {length}, beyond "
                                 f"max_length={self.max_length}; truncating would cut an image (raise max_length "
                                 "or lower the processor's max_pixels)")
            for key in keys:
                sample[key] = sample[key][:self.max_length]
        if length == 0:
            raise ValueError(f"{row.source}: the row processes to no tokens")
        return sample


class LazyImageTextDataset(Dataset):
    """Rows that are processed (images opened, tokens made) when a sample is drawn.

    ``task_ids``: each row's task index (added to its sample as a 1-element ``task_ids``), or ``None``.
    """

    def __init__(self, rows: list[Row], encoder: RowEncoder, task_ids: list[int] | None = None):
        self.rows = rows
        self.encoder = encoder
        self.task_ids = task_ids

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        sample = self.encoder(self.rows[index])
        if self.task_ids is not None:
            sample["task_ids"] = torch.tensor([self.task_ids[index]], dtype=torch.long)
        return sample


def _file_tasks(path: Path, limit: int | None) -> tuple[set[str], bool]:
    """(task names of a JSONL file's first ``limit`` rows, ``DEFAULT_TASK`` for a row without one; whether any
    row names a task). Lines that are not JSON objects are skipped here: reading the split reports them."""
    tasks: set[str] = set()
    named = False
    rows = 0
    with path.open("rb") as f:
        for raw in f:
            if limit is not None and rows >= limit:
                break
            if not raw.strip():
                continue
            rows += 1
            try:
                obj = parse_json(raw, str(path))
            except ValueError:  # a key given twice too
                continue
            task = obj.get("task") if isinstance(obj, dict) else None
            named |= task is not None
            tasks.add(task if isinstance(task, str) and task else DEFAULT_TASK)
    return tasks, named


class ImageTextJsonlDataModule(JsonlDataModule):
    """Image+text batches from local JSONL files, processed by a local transformers processor.

    Args:
        processor: local processor directory, or a processor object (see the module docstring
            for the contract); `lightprune.data.tiny_processor.tiny_qwen3_vl_processor` builds one for the
            tiny Qwen3-VL model.
        calibration, train, val, test, max_length, batch_size, padding_side,
        pad_to_multiple_of, mask_prompt, add_eos, num_samples, seed, num_workers, progress: as
            in `lightprune.data.TextJsonlDataModule`.
        task_names: the task families, in ``task_ids`` order (default: the rows' own, sorted; see the
            module docstring). A row whose task is not listed is an error naming the row.

    Batches hold ``input_ids``, ``attention_mask``, ``labels``, the processor's other per-token
    tensors (``mm_token_type_ids`` for Qwen3-VL), ``task_ids`` when the data has tasks and, when a row
    of the batch has an image, its image tensors (``pixel_values``, ``image_grid_thw`` for Qwen-VL).
    """

    allow_images = True

    def __init__(self, processor: Any, calibration: str | None = None, train: str | None = None,
                 val: str | None = None, test: str | None = None, *, max_length: int | None = 2048,
                 batch_size: int = 4, padding_side: str = "right", pad_to_multiple_of: int | None = None,
                 mask_prompt: bool = True, add_eos: bool = False, num_samples: int | None = None, seed: int = 0,
                 num_workers: int = 0, progress: bool | None = None, task_names: Sequence[str] | None = None):
        if task_names is not None:
            task_names = list(task_names)
            if not task_names or not all(isinstance(t, str) and t for t in task_names) \
                    or len(set(task_names)) != len(task_names):
                raise ValueError(f"task_names must be distinct non-empty strings, got {task_names!r}")
        self._task_names = task_names
        super().__init__(calibration, train, val, test, max_length=max_length, batch_size=batch_size,
                         padding_side=padding_side, pad_to_multiple_of=pad_to_multiple_of, mask_prompt=mask_prompt,
                         num_samples=num_samples, seed=seed, num_workers=num_workers, progress=progress)
        self.save_hyperparameters(ignore=[] if isinstance(processor, (str, os.PathLike)) else ["processor"])
        self.processor = load_processor(processor)
        self.pad_id = pad_token_id(self.processor.tokenizer)
        self.encoder = RowEncoder(self.processor, mask_prompt, max_length, add_eos)

    def _collator(self) -> Collator:
        return Collator(self.pad_id, self.padding_side, self.pad_to_multiple_of)

    @cached_property
    def task_names(self) -> list[str] | None:
        """Task families in ``task_ids`` order (``None``: the data has none, batches carry no ``task_ids``)."""
        if self._task_names is not None:
            return self._task_names
        found, named = set(), False
        for path in (p for p in self.paths.values() if p is not None):
            tasks, has = _file_tasks(path, self.num_samples)
            found |= tasks
            named |= has
        return sorted(found) if named else None

    def _dataset_from_rows(self, split: str, rows: list[Row]) -> LazyImageTextDataset:
        for row in rows:  # cheap: renders every conversation now, so template errors surface before any batch
            self.encoder.segments(row)
        names = self.task_names
        if names is None:
            return LazyImageTextDataset(rows, self.encoder)
        index = {name: i for i, name in enumerate(names)}
        for row in rows:
            if (row.task or DEFAULT_TASK) not in index:
                raise ValueError(f"{row.source}: task {row.task or DEFAULT_TASK!r} is not one of task_names {names}")
        return LazyImageTextDataset(rows, self.encoder, [index[row.task or DEFAULT_TASK] for row in rows])

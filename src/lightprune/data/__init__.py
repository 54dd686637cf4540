"""Datamodules and local tokenizers / processors (nothing is downloaded).

- `TextJsonlDataModule`: text JSONL (``text``, ``prompt``/``completion``, ``messages``).
- `ImageTextJsonlDataModule`: image+text JSONL through a local transformers processor.
- `DefaultCorpusDataModule`: the embedded default data (Python's documentation topics as
  instruction/text rows, and a tokenizer trained locally on them); `default_model_overrides`.
- `ShapesQADataModule`: the generated Shapes QA image-question set in task families
  (count, color, shape, position, text), cached as JSONL + PNG splits (train, val, selection,
  calibration), with ``task_ids`` in every batch; `shapes_qa_rows` makes its rows.
- `TestbedVQADataModule`: real-image question answering from installed packages (scikit-learn's
  handwritten digits, matplotlib bar charts) plus held-out Python documentation text, cached like
  Shapes QA; `testbed_vqa_splits` makes its rows.
- `train_bpe_tokenizer`: a byte-level BPE tokenizer trained locally, with pinned ids.
- `tiny_mllm_processor` (and `tiny_qwen3_vl_processor`, `tiny_qwen2_5_vl_processor`,
  `tiny_llava_onevision_processor`): local processors matching the tiny MLLMs of
  `lightprune.testing.tiny`.
- `SyntheticTokens`: seeded random ids, for smoke runs.

Generated data sets live in `generated`, cache folders in `cache`. May import: models, testing (the
tiny processors follow the tiny models' configs) and the shared leaves; nothing else of lightprune.
"""

from __future__ import annotations

import importlib
from typing import Any

from lightprune.data.default_corpus import (
    DefaultCorpusDataModule,
    DefaultCorpusError,
    build_default_corpus,
    default_corpus_dir,
    default_model_overrides,
    load_default_corpus,
)
from lightprune.data.generated.shapes_qa import (
    SHAPES_QA_TASKS,
    render_shapes,
    shapes_qa_rows,
    shapes_qa_splits,
    shapes_qa_texts,
)
from lightprune.data.generated.shapes_qa_datamodule import ShapesQADataModule, build_shapes_qa
from lightprune.data.generated.synthetic import SyntheticTokens
from lightprune.data.generated.testbed_vqa import TESTBED_VQA_TASKS, testbed_vqa_splits, testbed_vqa_texts
from lightprune.data.generated.testbed_vqa_datamodule import TestbedVQADataModule, build_testbed_vqa
from lightprune.data.generated.testbed_vqa_pictures import render_row
from lightprune.data.image_text import ImageTextJsonlDataModule, load_processor
from lightprune.data.rows import DEFAULT_TASK, JsonlRowError
from lightprune.data.text import TextJsonlDataModule, load_tokenizer
from lightprune.data.tokenizer import (
    CHAT_TOKENS,
    CHATML_TEMPLATE,
    CHATML_TEXT_TEMPLATE,
    IMAGE_TOKENS,
    chatml_template,
    train_bpe_tokenizer,
)

# imports transformers' processors at module level: loaded on first use
_LAZY = {name: ".tiny_processor" for name in (
    "TINY_PROCESSOR_FAMILIES", "TinyLlavaOnevisionProcessor", "TinyQwen2_5VLProcessor", "TinyQwen3VLProcessor",
    "tiny_llava_onevision_processor", "tiny_mllm_processor", "tiny_qwen2_5_vl_processor", "tiny_qwen3_vl_processor",
    "tiny_qwen3_vl_tokenizer", "tiny_mllm_tokenizer")}

__all__ = ["CHATML_TEMPLATE", "CHATML_TEXT_TEMPLATE", "CHAT_TOKENS", "chatml_template", "DEFAULT_TASK",
           "DefaultCorpusDataModule", "DefaultCorpusError",
           "IMAGE_TOKENS", "ImageTextJsonlDataModule", "JsonlRowError", "build_default_corpus", "default_corpus_dir",
           "default_model_overrides", "load_default_corpus", "SHAPES_QA_TASKS", "ShapesQADataModule",
           "build_shapes_qa", "render_shapes", "shapes_qa_rows", "shapes_qa_splits", "shapes_qa_texts",
           "SyntheticTokens", "TextJsonlDataModule",
           "TESTBED_VQA_TASKS", "TestbedVQADataModule", "build_testbed_vqa", "render_row", "testbed_vqa_splits",
           "testbed_vqa_texts", "load_processor", "load_tokenizer", "train_bpe_tokenizer",
           *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lightprune.data' has no attribute {name!r}")

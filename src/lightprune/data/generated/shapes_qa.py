"""Shapes QA: a generated image question-answering set in task families (nothing downloaded).

MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs", section 6.1) measures how much of a dense
MLLM's task accuracy a width-pruned model retains, per task, and needs an image-QA set small and learnable enough for a
tiny model. Shapes QA draws small RGB pictures with ``PIL.ImageDraw`` (no anti-aliasing, so every shape pixel has its
exact colour): 1 to 4 squares, circles and triangles, one per cell of a 2 x 2 grid with a margin (shapes never touch),
on a plain light-grey background. Each row is a chat (system, user, assistant) whose answer is one word or number, in
one of the task families `SHAPES_QA_TASKS`:

- ``count``: 1-4 shapes, "How many shapes are there?" -> "3";
- ``color``: 1-3 shapes of different kinds, "What colour is the circle?" -> "red";
- ``shape``: 1-3 shapes of different colours, "What shape is the blue one?" -> "triangle";
- ``position``: 2 shapes of different colours, one in each column, "Is the red shape on the left or
  the right?" -> "left";
- ``text`` (no image): "What is the last word: red circle left?" -> "left" (2 to 4 words from
  `TEXT_WORDS`): a copy task that a tiny transformer learns, unlike arithmetic.

Rows come from one seeded stream (``random.Random(seed)``): row ``i`` is of task
``tasks[i % len(tasks)]``, and a row whose picture (its shape list) or, for ``text``, whose question
was already drawn is redrawn, so no picture and no text question repeats anywhere in a stream.
`shapes_qa_splits` cuts one stream into consecutive, hence disjoint, splits; the evaluation
splits come first so that their rows do not change when the number of training rows does.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["BACKGROUND", "COLORS", "KINDS", "SHAPES_QA_SPLITS", "SHAPES_QA_TASKS", "SYSTEM_PROMPT", "TEXT_WORDS",
           "Shape", "ShapesQARow", "render_shapes", "shapes_qa_rows", "shapes_qa_splits", "shapes_qa_texts"]

SHAPES_QA_TASKS: tuple[str, ...] = ("count", "color", "shape", "position", "text")
# stream order: evaluation first, so that n_train does not move the evaluation rows
SHAPES_QA_SPLITS: tuple[str, ...] = ("val", "selection", "calibration", "train")
COLORS: dict[str, tuple[int, int, int]] = {"red": (220, 30, 30), "green": (30, 160, 60), "blue": (30, 70, 220),
                                           "yellow": (235, 200, 20)}
KINDS: tuple[str, ...] = ("square", "circle", "triangle")
BACKGROUND: tuple[int, int, int] = (235, 235, 235)
SYSTEM_PROMPT = "Answer with one word or number."
TEXT_WORDS: tuple[str, ...] = (*COLORS, *KINDS, "left", "right", "one", "two", "three")
_MAX_TRIES = 1000


@dataclass(frozen=True)
class Shape:
    """One drawn shape: ``kind`` in `KINDS`, ``color`` in `COLORS`, bounding box ``x, y, size`` (pixels)."""

    kind: str
    color: str
    x: int
    y: int
    size: int
    cell: int  # 0..3: row-major cell of the 2 x 2 grid (0, 2 are the left column)


@dataclass(frozen=True)
class ShapesQARow:
    """A generated row: its task, the user question, the answer and the shapes (empty for ``text``)."""

    task: str
    question: str
    answer: str
    shapes: tuple[Shape, ...] = ()

    @property
    def has_image(self) -> bool:
        return bool(self.shapes)

    def messages(self) -> list[dict[str, str]]:
        """System, user (``<image>`` first for image rows) and assistant turns."""
        user = ("<image>" if self.shapes else "") + self.question
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user},
                {"role": "assistant", "content": self.answer}]

    def to_json(self, image: str | None) -> dict[str, Any]:
        """The JSONL row (``image``: the picture's path relative to the JSONL file, for image rows)."""
        row: dict[str, Any] = {"task": self.task, "messages": self.messages(), "answer": self.answer}
        if self.shapes:
            row["image"] = image
            row["shapes"] = [asdict(s) for s in self.shapes]
        return row


def render_shapes(shapes: Sequence[Shape], image_size: int = 32):
    """The RGB ``PIL.Image`` of ``shapes`` on `BACKGROUND` (``image_size`` square)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (image_size, image_size), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for s in shapes:
        fill = COLORS[s.color]
        x1, y1 = s.x + s.size - 1, s.y + s.size - 1
        if s.kind == "square":
            draw.rectangle([s.x, s.y, x1, y1], fill=fill)
        elif s.kind == "circle":
            draw.ellipse([s.x, s.y, x1, y1], fill=fill)
        elif s.kind == "triangle":
            draw.polygon([(s.x + (s.size - 1) / 2, s.y), (s.x, y1), (x1, y1)], fill=fill)
        else:
            raise ValueError(f"unknown shape kind {s.kind!r}; choose one of {KINDS}")
    return image


def check_image_size(image_size: int) -> None:
    if not isinstance(image_size, int) or image_size < 24 or image_size % 2:
        raise ValueError(f"image_size must be an even int >= 24 (a 2 x 2 grid of cells with room for a shape "
                         f"of at least 8 pixels), got {image_size!r}")


def _place(rng: random.Random, cells: Sequence[int], kinds: Sequence[str], colors: Sequence[str],
           image_size: int) -> tuple[Shape, ...]:
    """Shapes of ``kinds`` / ``colors`` in ``cells``, each of a random size and offset inside its cell."""
    half = image_size // 2
    margin = 2
    largest = half - 2 * margin
    shapes = []
    for cell, kind, color in zip(cells, kinds, colors):
        size = rng.randint(max(6, largest // 2), largest)
        left, top = (cell % 2) * half + margin, (cell // 2) * half + margin
        x = rng.randint(left, left + largest - size)
        y = rng.randint(top, top + largest - size)
        shapes.append(Shape(kind, color, x, y, size, cell))
    return tuple(sorted(shapes, key=lambda s: s.cell))


def _draw(task: str, rng: random.Random, image_size: int) -> ShapesQARow:
    """One row of ``task`` (not yet checked for repeats)."""
    palette = list(COLORS)
    if task == "count":
        n = rng.randint(1, 4)
        shapes = _place(rng, rng.sample(range(4), n), [rng.choice(KINDS) for _ in range(n)],
                        [rng.choice(palette) for _ in range(n)], image_size)
        return ShapesQARow(task, "How many shapes are there?", str(n), shapes)
    if task == "color":
        n = rng.randint(1, 3)
        kinds = rng.sample(KINDS, n)
        shapes = _place(rng, rng.sample(range(4), n), kinds, [rng.choice(palette) for _ in range(n)], image_size)
        target = rng.choice(shapes)
        return ShapesQARow(task, f"What colour is the {target.kind}?", target.color, shapes)
    if task == "shape":
        n = rng.randint(1, 3)
        colors = rng.sample(palette, n)
        shapes = _place(rng, rng.sample(range(4), n), [rng.choice(KINDS) for _ in range(n)], colors, image_size)
        target = rng.choice(shapes)
        return ShapesQARow(task, f"What shape is the {target.color} one?", target.kind, shapes)
    if task == "position":
        cells = [rng.choice((0, 2)), rng.choice((1, 3))]  # one in the left column, one in the right
        shapes = _place(rng, cells, [rng.choice(KINDS) for _ in range(2)], rng.sample(palette, 2), image_size)
        target = rng.choice(shapes)
        side = "left" if target.cell % 2 == 0 else "right"
        return ShapesQARow(task, f"Is the {target.color} shape on the left or the right?", side, shapes)
    if task == "text":
        words = [rng.choice(TEXT_WORDS) for _ in range(rng.randint(2, 4))]
        return ShapesQARow(task, f"What is the last word: {' '.join(words)}?", words[-1])
    raise ValueError(f"unknown shapes QA task {task!r}; choose from {SHAPES_QA_TASKS}")


def check_task_names(tasks: Sequence[str]) -> tuple[str, ...]:
    tasks = tuple(tasks)
    bad = [t for t in tasks if t not in SHAPES_QA_TASKS]
    if not tasks or bad or len(set(tasks)) != len(tasks):
        raise ValueError(f"tasks must be distinct names from {SHAPES_QA_TASKS}, got {list(tasks)!r}")
    return tasks


def _stream(seed: int, tasks: Sequence[str], image_size: int) -> Iterator[ShapesQARow]:
    tasks = check_task_names(tasks)
    check_image_size(image_size)
    rng = random.Random(seed)
    seen: set = set()
    i = 0
    while True:
        task = tasks[i % len(tasks)]
        for _ in range(_MAX_TRIES):
            row = _draw(task, rng, image_size)
            key = row.shapes if row.shapes else row.question
            if key not in seen:
                break
        else:
            raise ValueError(f"cannot draw another distinct {task!r} row after {i} rows ({_MAX_TRIES} repeats in "
                             "a row); ask for fewer rows")
        seen.add(key)
        i += 1
        yield row


def shapes_qa_rows(n: int, seed: int = 0, tasks: Sequence[str] = SHAPES_QA_TASKS,
                   image_size: int = 32) -> list[ShapesQARow]:
    """The first ``n`` rows of the stream of ``seed`` (no picture or text question repeats).

    Render a row's picture with ``render_shapes(row.shapes, image_size)``.
    """
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    stream = _stream(seed, tasks, image_size)
    return [next(stream) for _ in range(n)]


def shapes_qa_splits(sizes: Mapping[str, int], seed: int = 0, tasks: Sequence[str] = SHAPES_QA_TASKS,
                     image_size: int = 32) -> dict[str, list[ShapesQARow]]:
    """Disjoint splits of one stream: ``sizes[split]`` consecutive rows each, in `SHAPES_QA_SPLITS` order."""
    unknown = sorted(set(sizes) - set(SHAPES_QA_SPLITS))
    if unknown:
        raise ValueError(f"unknown splits {unknown}; choose from {SHAPES_QA_SPLITS}")
    for split, n in sizes.items():
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"the size of split {split!r} must be an int >= 0, got {n!r}")
    rows = shapes_qa_rows(sum(sizes.values()), seed, tasks, image_size)
    out, start = {}, 0
    for split in SHAPES_QA_SPLITS:
        if split in sizes:
            out[split] = rows[start:start + sizes[split]]
            start += sizes[split]
    return out


def shapes_qa_texts() -> list[str]:
    """Texts that cover the set's vocabulary: train a tiny tokenizer on them (with printable ASCII) so that
    questions and answers get whole-word tokens, e.g. ``tiny_mllm_processor(family, texts=TINY_CORPUS +
    tuple(shapes_qa_texts()))``."""
    texts = [SYSTEM_PROMPT, "How many shapes are there?", "What is the last word:", " ".join(TEXT_WORDS)]
    texts += [f"What colour is the {kind}? {color}" for kind in KINDS for color in COLORS]
    texts += [f"What shape is the {color} one? {kind}" for color in COLORS for kind in KINDS]
    texts += [f"Is the {color} shape on the left or the right? {side}" for color in COLORS for side in ("left", "right")]
    texts += [str(n) for n in range(1, 5)]
    return texts

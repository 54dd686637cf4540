"""Testbed VQA: question answering on real images that ship inside installed packages (nothing downloaded).

A set for training and pruning small multimodal testbed models, with two image sources and held-out
text. Each row is a chat whose answer is one word, in one of the task families `TESTBED_VQA_TASKS`:

- ``digit``: one of scikit-learn's 1797 handwritten digits (``sklearn.datasets.load_digits()``, 8 x 8
  grey levels 0-16, shipped with scikit-learn), dark on white, upscaled (nearest) to ``image_size``;
  "Which digit is written?" -> "seven";
- ``chart_tallest``: a bar chart drawn by matplotlib (Agg, no axes, ticks or text; bars on whole
  pixels, so every bar pixel has its exact colour) of 2-4 bars of distinct colours (`BAR_COLORS`)
  and distinct heights (levels 1 to `BAR_LEVELS`); "Which colour is the tallest bar?" -> "red";
- ``chart_count``: such a chart; "How many bars are there?" -> "three";
- ``chart_left`` (not in the default set: `TESTBED_VQA_EXTRA_TASKS`): such a chart; "Which colour is the
  leftmost bar?" -> "blue" (a colour question a small model answers: the tallest bar's colour needs heights one
  level apart told apart, and the trained testbeds answer it 21-63% of the time, chance 1/6);
- ``text`` (no image, no system turn): a prompt and a completion of at most
  `TEXT_COMPLETION_CHARS` characters from Python's documentation (the default corpus rows of
  `lightprune.data.pydoc_rows.corpus_splits`), to measure text perplexity on held-out text.
  An instruction row keeps its prompt ("Explain the Python topic 'with':"); a text chunk becomes
  `TEXT_PROMPT` plus its first sentence (or line) -> what follows. Splits take the corpus's own
  topic splits (`TEXT_SOURCE_SPLITS`: ``val`` the corpus's ``val`` and ``test`` topics, ``selection``
  and ``calibration`` one half each of its ``calibration`` topics), so text rows of different splits never
  share a topic (and a completion that two splits' topics share stays in ``train`` only).

`testbed_vqa_splits` draws rows from one seeded stream (``random.Random(seed)``), the splits
in `TESTBED_VQA_SPLITS` order (evaluation first, so ``train``'s size does not move them); row
``i`` of the stream is of task ``tasks[i % len(tasks)]``. No picture repeats in a stream (a digit by its
index, a chart by its bar list, whichever chart task drew it) and no text row repeats, so the splits
are disjoint. `render_row` draws a row's picture
(`testbed_vqa_pictures`); the same row gives the same pixels every run.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from lightprune.data.generated.testbed_vqa_pictures import BAR_COLORS, BAR_LEVELS, Bar, digit_images
from lightprune.data.pydoc_rows import corpus_splits

__all__ = ["COUNT_WORDS", "DIGIT_WORDS", "SYSTEM_PROMPT", "TASK_QUESTIONS", "TESTBED_VQA_EXTRA_TASKS",
           "TESTBED_VQA_SPLITS", "TESTBED_VQA_TASKS", "TEXT_COMPLETION_CHARS", "TEXT_PROMPT", "TEXT_SOURCE_SPLITS",
           "TestbedVQARow", "testbed_vqa_splits", "testbed_vqa_texts", "text_pool"]

TESTBED_VQA_TASKS: tuple[str, ...] = ("digit", "chart_tallest", "chart_count", "text")
#: tasks a caller may ask for beside the default :data:`TESTBED_VQA_TASKS` (left out of the default, so that the
#: default set's rows and tokenizer texts stay those of the testbeds trained before them)
TESTBED_VQA_EXTRA_TASKS: tuple[str, ...] = ("chart_left",)
# stream order: evaluation first, so that n_train does not move the evaluation rows
TESTBED_VQA_SPLITS: tuple[str, ...] = ("val", "selection", "calibration", "train")
# split -> the default corpus splits its text rows come from, as (corpus split, half): half None takes every topic,
# 0 / 1 the topics of that parity of their name's SHA-256. val takes two held-out topic splits (about 300 rows, so
# that 200 of them can be asked for); selection and calibration share the calibration topics out: every two splits
# stay topic-disjoint
TEXT_SOURCE_SPLITS: dict[str, tuple[tuple[str, int | None], ...]] = {
    "val": (("val", None), ("test", None)), "selection": (("calibration", 0),),
    "calibration": (("calibration", 1),), "train": (("train", None),)}
DIGIT_WORDS: tuple[str, ...] = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
COUNT_WORDS: dict[int, str] = {2: "two", 3: "three", 4: "four"}
SYSTEM_PROMPT = "Answer with one word."
DIGIT_QUESTION = "Which digit is written?"
TALLEST_QUESTION = "Which colour is the tallest bar?"
LEFT_QUESTION = "Which colour is the leftmost bar?"
COUNT_QUESTION = "How many bars are there?"
TEXT_PROMPT = "Continue the Python documentation:"
#: each image task's question
TASK_QUESTIONS: dict[str, str] = {"digit": DIGIT_QUESTION, "chart_tallest": TALLEST_QUESTION,
                                  "chart_count": COUNT_QUESTION, "chart_left": LEFT_QUESTION}
#: each extra task's answer words (its tokenizer texts: the default tasks' are listed in :func:`testbed_vqa_texts`)
_EXTRA_ANSWER_WORDS: dict[str, tuple[str, ...]] = {"chart_left": tuple(BAR_COLORS)}
TEXT_COMPLETION_CHARS = 200
_TEXT_HEAD_CHARS = (40, 160)  # a text chunk's prompt part: from its first boundary in this range of lengths
_BOUNDARY = re.compile(r"[.!?:](?=\s)|\n")
_MAX_TRIES = 1000


@dataclass(frozen=True)
class TestbedVQARow:
    """A generated row: task, question, answer, and what it shows (a digit's index, bars, or a text topic)."""

    __test__ = False  # not a pytest test class

    task: str
    question: str
    answer: str
    digit: int | None = None  # index into sklearn's load_digits()
    bars: tuple[Bar, ...] = ()
    topic: str | None = None  # text rows: the Python documentation topic

    @property
    def has_image(self) -> bool:
        return self.task != "text"

    @property
    def key(self) -> tuple:
        """What may not repeat in a stream: the picture (digit index, bar list) or the text pair."""
        if self.digit is not None:
            return ("digit", self.digit)
        if self.bars:
            return ("chart", self.bars)
        return ("text", self.question, self.answer)

    def messages(self) -> list[dict[str, str]]:
        """Image rows: system, user (``<image>`` first), assistant; text rows: user, assistant."""
        if not self.has_image:
            return [{"role": "user", "content": self.question}, {"role": "assistant", "content": self.answer}]
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "<image>" + self.question},
                {"role": "assistant", "content": self.answer}]

    def to_json(self, image: str | None) -> dict[str, Any]:
        """The JSONL row; ``image``: the picture's path relative to the JSONL file (image rows)."""
        row: dict[str, Any] = {"task": self.task, "messages": self.messages(), "answer": self.answer}
        if self.has_image:
            row["image"] = image
        if self.digit is not None:
            row["digit"] = self.digit
        if self.bars:
            row["bars"] = [asdict(b) for b in self.bars]
        if self.topic is not None:
            row["topic"] = self.topic
        return row


# -- text --------------------------------------------------------------------------------------
def _clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters: at a sentence or line end when one is past a third of
    ``limit``, else at a space."""
    text = text.rstrip()
    if len(text) <= limit:
        return text
    ends = [m.end() for m in _BOUNDARY.finditer(text) if limit // 3 <= m.end() <= limit]
    if ends:
        return text[:ends[-1]].rstrip()
    space = text.rfind(" ", 0, limit + 1)
    return text[:space].rstrip() if space > 0 else text[:limit]


def _text_pair(row: Mapping[str, str]) -> tuple[str, str] | None:
    """(question, answer) of one default corpus row, or ``None`` when nothing is left to complete."""
    if "completion" in row:
        question, answer = row["prompt"].strip(), _clip(row["completion"], TEXT_COMPLETION_CHARS)
    else:
        text = row["text"].rstrip()
        low, high = _TEXT_HEAD_CHARS
        cuts = [m.end() for m in _BOUNDARY.finditer(text) if low <= m.end() <= high]
        if cuts:
            cut = cuts[0]
        else:  # no sentence or line end in range: a space near the middle
            cut = text.rfind(" ", 0, min(len(text) // 2, high) + 1)
            if cut <= 0:
                return None
        rest = text[cut:]
        if text[cut - 1] != "\n":  # after a sentence end or a space (a line cut keeps the next line's indent)
            rest = rest.lstrip(" ")
        rest = rest.lstrip("\n")
        question, answer = f"{TEXT_PROMPT}\n{text[:cut].rstrip()}", _clip(rest, TEXT_COMPLETION_CHARS)
    return (question, answer) if question and answer.strip() else None


def _topic_half(topic: str) -> int:
    """0 or 1: the parity of the first byte of the SHA-256 of a topic's name."""
    return hashlib.sha256(topic.encode("utf-8")).digest()[0] & 1


@lru_cache(maxsize=1)
def _text_pools() -> dict[str, tuple[tuple[str, str, str], ...]]:
    corpus = corpus_splits()
    pools = {}
    for split, sources in TEXT_SOURCE_SPLITS.items():
        items, seen = [], set()
        for source, half in sources:
            for row in corpus[source]:
                if half is not None and _topic_half(row["topic"]) != half:
                    continue
                pair = _text_pair(row)
                if pair is not None and pair not in seen:
                    seen.add(pair)
                    items.append((*pair, row["topic"]))
        pools[split] = items
    # the same words can end two topics ("described by the following lexical definitions:"): held-out
    # splits drop an answer that another split also has, so no completion is in two splits
    for split in pools:
        if split != "train":
            others = {answer for other, items in pools.items() if other != split for _, answer, _ in items}
            pools[split] = [item for item in pools[split] if item[1] not in others]
    return {split: tuple(items) for split, items in pools.items()}


def text_pool(split: str) -> tuple[tuple[str, str, str], ...]:
    """``(question, answer, topic)`` of every text row that ``split`` may draw, in corpus order."""
    if split not in TESTBED_VQA_SPLITS:
        raise ValueError(f"split must be one of {TESTBED_VQA_SPLITS}, got {split!r}")
    return _text_pools()[split]


# -- the stream --------------------------------------------------------------------------------
def check_tasks(tasks: Sequence[str]) -> tuple[str, ...]:
    tasks = (tasks,) if isinstance(tasks, str) else tuple(tasks)
    known = TESTBED_VQA_TASKS + TESTBED_VQA_EXTRA_TASKS
    bad = [t for t in tasks if t not in known]
    if bad:
        raise ValueError(f"unknown testbed VQA task {bad[0]!r}; choose from {known}")
    if not tasks or len(set(tasks)) != len(tasks):
        raise ValueError(f"tasks must be distinct names from {known}, got {list(tasks)!r}")
    return tasks


def _check_sizes(sizes: Mapping[str, int]) -> dict[str, int]:
    unknown = sorted(set(sizes) - set(TESTBED_VQA_SPLITS))
    if unknown:
        raise ValueError(f"unknown splits {unknown}; choose from {TESTBED_VQA_SPLITS}")
    for split, n in sizes.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"the size of split {split!r} must be an int >= 0, got {n!r}")
    return {split: sizes[split] for split in TESTBED_VQA_SPLITS if split in sizes}


def _task_counts(sizes: Mapping[str, int], tasks: Sequence[str]) -> dict[str, dict[str, int]]:
    """Rows of each task per split (row ``i`` of the stream is of ``tasks[i % len(tasks)]``)."""
    counts, start = {}, 0
    for split, n in sizes.items():
        counts[split] = {task: len(range((k - start) % len(tasks), n, len(tasks)))
                         for k, task in enumerate(tasks)}
        start += n
    return counts


def _draw_chart(task: str, rng: random.Random) -> TestbedVQARow:
    n = rng.randint(2, 4)
    colors = rng.sample(list(BAR_COLORS), n)
    heights = rng.sample(range(1, BAR_LEVELS + 1), n)
    bars = tuple(Bar(c, h) for c, h in zip(colors, heights))
    if task == "chart_tallest":
        return TestbedVQARow(task, TALLEST_QUESTION, max(bars, key=lambda b: b.height).color, bars=bars)
    if task == "chart_left":
        return TestbedVQARow(task, LEFT_QUESTION, bars[0].color, bars=bars)
    return TestbedVQARow(task, COUNT_QUESTION, COUNT_WORDS[n], bars=bars)


def testbed_vqa_splits(sizes: Mapping[str, int], seed: int = 0,
                       tasks: Sequence[str] = TESTBED_VQA_TASKS) -> dict[str, list[TestbedVQARow]]:
    """Disjoint splits of one seeded stream: ``sizes[split]`` rows each (see the module docstring).

    Raises ``ValueError`` when more ``digit`` rows are asked for than sklearn has images, or more ``text``
    rows in a split than its topics give (`text_pool`).
    """
    sizes = _check_sizes(sizes)
    tasks = check_tasks(tasks)
    counts = _task_counts(sizes, tasks)
    digit_labels: tuple[int, ...] = ()
    if "digit" in tasks:
        asked = sum(c["digit"] for c in counts.values())
        digit_labels = digit_images()[1] if asked else ()
        if asked > len(digit_labels):
            raise ValueError(f"the splits {sizes} hold {asked} 'digit' rows, but scikit-learn's load_digits has "
                             f"{len(digit_labels)} images; ask for fewer rows or leave 'digit' out of tasks")
    pools: dict[str, list[tuple[str, str, str]]] = {}
    for split, count in counts.items():
        if count.get("text"):
            pools[split] = list(text_pool(split))
            if count["text"] > len(pools[split]):
                raise ValueError(f"split {split!r} holds {count['text']} 'text' rows, but its Python documentation "
                                 f"topics give {len(pools[split])}; ask for fewer {split} rows or leave 'text' out "
                                 "of tasks")
    rng = random.Random(seed)
    unused_digits = list(range(len(digit_labels)))
    seen: set = set()
    out: dict[str, list[TestbedVQARow]] = {}
    i = 0
    for split, n in sizes.items():
        rows = out[split] = []
        for _ in range(n):
            task = tasks[i % len(tasks)]
            if task == "digit":  # draw from the indices not drawn yet
                index = unused_digits.pop(rng.randrange(len(unused_digits)))
                row = TestbedVQARow(task, DIGIT_QUESTION, DIGIT_WORDS[digit_labels[index]], digit=index)
            elif task == "text":
                question, answer, topic = pools[split].pop(rng.randrange(len(pools[split])))
                row = TestbedVQARow(task, question, answer, topic=topic)
            else:
                for _ in range(_MAX_TRIES):
                    row = _draw_chart(task, rng)
                    if row.key not in seen:
                        break
                else:
                    raise ValueError(f"cannot draw another distinct chart after {i} rows ({_MAX_TRIES} repeats in "
                                     "a row); ask for fewer rows")
            seen.add(row.key)
            rows.append(row)
            i += 1
    return out


def testbed_vqa_texts(tasks: Sequence[str] = TESTBED_VQA_TASKS) -> list[str]:
    """Texts to train a tokenizer on: the system prompt, every question and answer word (the default tasks', and
    those of the extra ``tasks``), and the ``train`` split's text rows, e.g.
    ``tiny_mllm_processor(family, texts=TINY_CORPUS + tuple(testbed_vqa_texts()))``."""
    texts = [SYSTEM_PROMPT, DIGIT_QUESTION, TALLEST_QUESTION, COUNT_QUESTION, TEXT_PROMPT,
             " ".join(DIGIT_WORDS), " ".join(BAR_COLORS), " ".join(COUNT_WORDS.values())]
    texts += [f"{DIGIT_QUESTION} {word}" for word in DIGIT_WORDS]
    texts += [f"{TALLEST_QUESTION} {color}" for color in BAR_COLORS]
    texts += [f"{COUNT_QUESTION} {word}" for word in COUNT_WORDS.values()]
    for task in (t for t in check_tasks(tasks) if t in TESTBED_VQA_EXTRA_TASKS):
        question = TASK_QUESTIONS[task]
        texts += [question] + [f"{question} {word}" for word in _EXTRA_ANSWER_WORDS[task]]
    for question, answer, _ in text_pool("train"):
        texts += [question, answer]
    return texts


# names that start with "test": not pytest tests when a test module imports them
testbed_vqa_splits.__test__ = testbed_vqa_texts.__test__ = False  # type: ignore[attr-defined]

"""Instruction and text rows from Python's own documentation (``pydoc_data.topics``), and their splits.

The standard library's ``pydoc_data.topics`` holds the language reference topics that
``help()`` shows (a dict of topic name -> text, about 460 kB); it ships with every CPython, so
the default corpus needs no download. Each topic becomes rows:

- ``topic``: prompt ``Explain the Python topic '<name>':`` -> the topic's first paragraphs;
- ``section``: prompt ``Explain '<section>' in the Python topic '<name>':`` -> that section's
  first paragraphs;
- ``api``: prompt ``Describe the Python API '<signature>':`` -> the first paragraph of its entry
  (``object.__new__(cls[, ...])``, ``str.split(sep=None, maxsplit=-1)``, ...);
- ``grammar``: prompt ``Write the grammar rule for '<symbol>':`` -> the grammar block;
- ``text``: the cleaned topic in chunks of whole paragraphs (about 400 characters; a longer
  paragraph is cut at sentence ends).

Every row also carries its ``topic`` and ``kind`` (extra keys, which the datamodules ignore).
Cleaning maps typographic quotes and dashes to ASCII, drops footnotes and heading underlines
and unwraps prose paragraphs; code and grammar blocks keep their lines.

Topics overlap (``if`` is a section of ``compound``, ``customization`` of ``specialnames``), so
a paragraph that several topics hold is kept only in the shortest of them (ties by name), and a
heading left with nothing under it goes too: no text is in two topics, hence in two splits.

Splits are disjoint by topic, by a fixed rule: topics are taken in the order of the SHA-256 of
their names, and each goes to the split furthest below its share of the characters so far
(`SPLIT_SHARES`). Rows within a split are ordered by the SHA-256 of ``topic/index``, so
that the first rows of a split are a mix of topics.
"""

from __future__ import annotations

import hashlib
import re
import textwrap
from dataclasses import dataclass

__all__ = ["SPLIT_SHARES", "corpus_splits", "python_topics", "split_topics", "topic_blocks", "topic_rows"]

SPLIT_SHARES = {"train": 0.7, "val": 0.1, "calibration": 0.1, "test": 0.1}
_CHUNK_CHARS = 400
_ANSWER_CHARS = 400
_TYPOGRAPHY = str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"', "\u2026": "...",
                             "\u2014": "--", "\u2013": "-", "\u00a0": " ", "\t": "    "})
_UNDERLINE = re.compile(r"^([*=\-~^\"])\1{2,}$")
_LEVELS = "*=-~^\""
_FOOTNOTE_REF = re.compile(r"(?<=\S) +\[\d+\](?=\s|$)")
_LIST_ITEM = re.compile(r"^(?:[*\-+]|\d+\.|#\.|\(\d+\))\s")
_SENTENCE_END = re.compile(r"(?<=[.!?:])\s+(?=[A-Z\"(*])")
_SIGNATURE = re.compile(r"^(?:(?:class|async|await)\s+)?[A-Za-z_][\w.]*(?:\([^\n]*\))?(?:\s*->\s*\S[^\n]*)?$")


def python_topics() -> dict[str, str]:
    """``pydoc_data.topics.topics``: Python's documentation topics shipped with the interpreter."""
    try:
        from pydoc_data.topics import topics
    except ImportError as e:  # pragma: no cover - some distributions split the standard library
        raise RuntimeError("the default corpus is built from the standard library's pydoc_data.topics, which "
                           "this Python lacks (install the full standard library, e.g. Debian's "
                           "libpython3-stdlib), or give your own JSONL files to TextJsonlDataModule") from e
    return dict(topics)


@dataclass
class Block:
    """A heading (with its ``level``: 0 for the title), a prose paragraph (unwrapped) or a code block."""

    kind: str  # heading | prose | code
    text: str
    lines: tuple[str, ...] = ()
    level: int = 0


def _unwrap(lines) -> str:
    out = ""
    for raw in lines:
        line = raw.strip()
        if not out:
            out = line
        elif _LIST_ITEM.match(raw):
            out += "\n" + line  # a list keeps one line per item
        elif out.endswith("-") and line[:1].islower():
            out += line  # a hyphenated word broken by the wrap ("non-" / "virtual")
        else:
            out += " " + line
    return _FOOTNOTE_REF.sub("", out)


def _body(lines: list[str]) -> Block:
    if lines[0].startswith(" ") or any(line.startswith(("+-", "+=", "|")) for line in lines):  # code, tables
        return Block("code", "\n".join(lines), tuple(lines))
    return Block("prose", _unwrap(lines), tuple(lines))


def parse_topic(raw: str) -> list[Block]:
    """The cleaned blocks of one topic's text, in order."""
    text = raw.translate(_TYPOGRAPHY).split("\n-[ Footnotes ]-")[0]
    groups, current = [], []
    for line in [line.rstrip() for line in text.split("\n")] + [""]:
        if line:
            current.append(line)
        elif current:
            groups.append(current)
            current = []
    blocks = []
    for group in groups:
        start = 0
        for i in range(len(group) - 1):  # a title line followed by its underline
            if i >= start and _UNDERLINE.match(group[i + 1]) and not group[i].startswith(" "):
                if i > start:
                    blocks.append(_body(group[start:i]))
                blocks.append(Block("heading", group[i].strip(), level=_LEVELS.index(group[i + 1][0])))
                start = i + 2
        if start < len(group) and not all(_UNDERLINE.match(line) for line in group[start:]):  # a transition
            blocks.append(_body(group[start:]))
    return blocks


def topic_blocks(topics: dict[str, str]) -> dict[str, list[Block]]:
    """Every topic's blocks, with shared paragraphs kept only in the shortest topic holding them."""
    parsed = {name: parse_topic(text) for name, text in topics.items()}
    owner: dict[str, str] = {}
    for name in sorted(parsed, key=lambda n: (len(topics[n]), n)):
        for b in parsed[name]:
            if b.kind != "heading":
                owner.setdefault(b.text, name)
    out = {}
    for name, blocks in parsed.items():
        kept = [b for b in blocks if b.kind == "heading" or owner[b.text] == name]
        trimmed: list[Block] = []
        for b in reversed(kept):  # a heading with nothing under it (before its next peer) goes
            if b.kind == "heading" and (not trimmed or (trimmed[-1].kind == "heading"
                                                        and trimmed[-1].level <= b.level)):
                continue
            trimmed.append(b)
        out[name] = trimmed[::-1]
    return out


def _sentences(text: str, limit: int) -> list[str]:
    """``text`` in pieces of whole sentences, each at most ``limit`` characters when it can be."""
    pieces, current = [], ""
    for sentence in _SENTENCE_END.split(text):
        if current and len(current) + 1 + len(sentence) > limit:
            pieces.append(current)
            current = ""
        current = f"{current} {sentence}" if current else sentence
    return pieces + [current] if current else pieces


def _answer(paragraphs: list[str]) -> str:
    """Whole paragraphs up to about ``_ANSWER_CHARS``; a long first paragraph cut at a sentence end."""
    out: list[str] = []
    for paragraph in paragraphs:
        if out and sum(len(p) for p in out) + len(paragraph) > _ANSWER_CHARS:
            break
        out.append(paragraph)
    if len(out[0]) > 2 * _ANSWER_CHARS:
        out = [_sentences(out[0], _ANSWER_CHARS)[0]]
    return "\n\n".join(out)


def _text_chunks(blocks: list[Block]) -> list[str]:
    pieces: list[str] = []
    for b in blocks:
        if len(b.text) <= _CHUNK_CHARS:
            pieces.append(b.text)
        elif b.kind == "prose":
            pieces += _sentences(b.text, _CHUNK_CHARS)
        else:  # long code: split on lines
            part: list[str] = []
            for line in b.text.split("\n"):
                if part and sum(len(x) + 1 for x in part) + len(line) > _CHUNK_CHARS:
                    pieces.append("\n".join(part))
                    part = []
                part.append(line)
            pieces.append("\n".join(part))
    chunks, current = [], ""
    for piece in pieces:
        if current and len(current) + 2 + len(piece) > _CHUNK_CHARS:
            chunks.append(current)
            current = ""
        current = f"{current}\n\n{piece}" if current else piece
    return chunks + [current] if current else chunks


def _signature(b: Block) -> str | None:
    """The API signature(s) a prose block names (``object.__iadd__(self, other)`` ...), else None."""
    if b.kind != "prose" or not all(_SIGNATURE.match(line) and ("(" in line or "." in line) for line in b.lines):
        return None
    names = [line.strip() for line in b.lines]
    return ", ".join(names) if len(names) <= 2 else f"{names[0]}, ... ({len(names)} methods)"


def topic_rows(name: str, blocks: list[Block]) -> list[dict[str, str]]:
    """The rows of one topic (see the module docstring), in document order."""
    rows: list[dict[str, str]] = []

    def qa(kind: str, prompt: str, completion: str) -> None:
        rows.append({"prompt": prompt + "\n", "completion": completion, "topic": name, "kind": kind})

    sections: list[tuple[Block | None, list[str]]] = [(None, [])]
    for i, b in enumerate(blocks):
        if b.kind == "heading":
            sections.append((b, []))
        elif b.kind == "prose":
            sections[-1][1].append(b.text)
            nxt = blocks[i + 1] if i + 1 < len(blocks) else None
            signature = _signature(b)
            if signature and nxt is not None and nxt.kind == "code":
                body = textwrap.dedent(nxt.text)
                lines = body.split("\n")
                qa("api", f"Describe the Python API '{signature}':",
                   body if any(line.startswith(" ") for line in lines) else _unwrap(lines))
        elif "::=" in b.text:
            body = textwrap.dedent(b.text)
            qa("grammar", f"Write the grammar rule for '{body.split()[0]}':", body)
    for heading, paragraphs in sections:
        if not paragraphs:
            continue
        if heading is None or heading.level == 0:
            qa("topic", f"Explain the Python topic '{name}':", _answer(paragraphs))
        else:
            qa("section", f"Explain '{heading.text}' in the Python topic '{name}':", _answer(paragraphs))
    rows += [{"text": chunk, "topic": name, "kind": "text"} for chunk in _text_chunks(blocks)]
    return rows


def split_topics(sizes: dict[str, int]) -> dict[str, list[str]]:
    """Topic names per split: SHA-256 order, each to the split furthest below its share of ``sizes``."""
    filled = {split: 0 for split in SPLIT_SHARES}
    out: dict[str, list[str]] = {split: [] for split in SPLIT_SHARES}
    total = 0
    for name in sorted(sizes, key=lambda n: hashlib.sha256(n.encode()).hexdigest()):
        total += sizes[name]
        split = max(SPLIT_SHARES, key=lambda s: SPLIT_SHARES[s] * total - filled[s])
        filled[split] += sizes[name]
        out[split].append(name)
    return {split: sorted(names) for split, names in out.items()}


def corpus_splits(topics: dict[str, str] | None = None) -> dict[str, list[dict[str, str]]]:
    """``{split: rows}`` of the default corpus, in memory (``topics``: Python's, by default)."""
    blocks = topic_blocks(python_topics() if topics is None else topics)
    blocks = {name: b for name, b in blocks.items() if any(x.kind != "heading" for x in b)}
    splits = split_topics({name: sum(len(x.text) for x in b) for name, b in blocks.items()})
    out = {}
    for split, names in splits.items():
        keyed = [(hashlib.sha256(f"{name}/{i}".encode()).hexdigest(), row)
                 for name in names for i, row in enumerate(topic_rows(name, blocks[name]))]
        out[split] = [row for _, row in sorted(keyed, key=lambda kv: kv[0])]
    return out

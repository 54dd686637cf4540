"""Rows -> text segments that are labels or not: the one place that decides what is masked.

A row becomes a list of `Segment` (text, trainable, images). Each segment is tokenised
on its own and the ids are concatenated, so the label mask falls on token boundaries exactly:

- ``text``: one trainable segment.
- ``prompt_completion``: the prompt (not trainable), then the completion (trainable).
- ``messages``: rendered with a chat template, one turn at a time. Turn ``i``'s text is the
  part of ``render(messages[:i + 1])`` after ``render(messages[:i])``; for an assistant turn
  the header that ``add_generation_prompt=True`` adds (``<|im_start|>assistant\\n``) is not
  trainable, the rest of the turn (content and end-of-turn marker) is. This needs a template
  whose renderings of a conversation's prefixes are prefixes of each other (ChatML, Llama,
  Qwen-VL and most others are); one that is not is reported with the row's ``path:line``.

With ``mask_prompt=False`` every segment is trainable (and a conversation is one segment).
Text and prompt/completion rows also get the tokenizer's own special tokens (a BOS for
Llama-style tokenizers; none for Qwen-style ones), found by `special_affixes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightprune.data.rows import IMAGE_PLACEHOLDER, JsonlRowError, Row

__all__ = ["ChatRenderer", "Segment", "build_conversation", "chat_renderer", "row_segments", "special_affixes"]



@dataclass
class Segment:
    text: str
    trainable: bool
    images: list[Path] = field(default_factory=list)


def special_affixes(tokenizer) -> tuple[list[int], list[int]]:
    """The ids a tokenizer adds before and after a text when ``add_special_tokens=True``."""
    probe = "lightprune probe"
    plain = list(tokenizer(probe, add_special_tokens=False)["input_ids"])
    full = list(tokenizer(probe, add_special_tokens=True)["input_ids"])
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return full[:start], full[start + len(plain):]
    return [], []


class ChatRenderer:
    """``render(messages, add_generation_prompt) -> str`` with ``owner``'s chat template (picklable)."""

    def __init__(self, owner, name: str):
        self.owner = owner
        self.name = name

    def __call__(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.owner.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def chat_renderer(owner, name: str) -> ChatRenderer | None:
    """A renderer with ``owner``'s chat template (a tokenizer or a processor), or ``None`` without one."""
    if not getattr(owner, "chat_template", None):
        return None
    return ChatRenderer(owner, name)


def build_conversation(row: Row) -> tuple[list[dict[str, Any]], list[list[Path]]]:
    """The row's messages with images as content parts, and the images of each message in order.

    An ``<image>`` placeholder in a string content becomes an image part; with no placeholders
    and no image parts, the images go before the text of the first user message.
    """
    images = list(row.images)
    has_slots = any(
        (isinstance(m["content"], str) and IMAGE_PLACEHOLDER in m["content"])
        or (isinstance(m["content"], list) and any(p.get("type") == "image" for p in m["content"]))
        for m in row.messages)
    conversation, per_message = [], []
    pending = iter(images)
    first_user = next((i for i, m in enumerate(row.messages) if m["role"] == "user"), None)
    for i, m in enumerate(row.messages):
        content = m["content"]
        mine: list[Path] = []
        if isinstance(content, str) and images and (IMAGE_PLACEHOLDER in content or (not has_slots and i == first_user)):
            pieces = content.split(IMAGE_PLACEHOLDER) if has_slots else ["", content]
            parts: list[dict[str, Any]] = []
            for k, piece in enumerate(pieces):
                if k:
                    parts.append({"type": "image"})
                    mine.append(next(pending))
                if piece:
                    parts.append({"type": "text", "text": piece})
            content = parts
        elif isinstance(content, list):
            content = [dict(p) for p in content]
            if images and not has_slots and i == first_user:
                content = [{"type": "image"} for _ in images] + content
            for p in content:
                if p.get("type") == "image":
                    mine.append(next(pending))
        conversation.append({**m, "content": content})
        per_message.append(mine)
    return conversation, per_message


def _chat_segments(row: Row, render: ChatRenderer, mask_prompt: bool) -> list[Segment]:
    conversation, images = build_conversation(row)
    if not mask_prompt:
        return [Segment(render(conversation, False), True, [p for ps in images for p in ps])]
    segments: list[Segment] = []
    previous = ""

    def after(prefix: str, text: str, what: str) -> str:
        if not text.startswith(prefix):
            raise JsonlRowError(
                f"{row.source}: the chat template of the {getattr(render, 'name', 'tokenizer')} renders "
                f"{what} so that an earlier rendering is not its prefix; per-turn label masks need a "
                "prefix-stable template (or pass mask_prompt=False)")
        return text[len(prefix):]

    for i, message in enumerate(conversation):
        full = render(conversation[:i + 1], False)
        if message["role"] == "assistant":
            header = render(conversation[:i], True) if i else render([], True)
            segments.append(Segment(after(previous, header, f"the header of turn {i}"), False))
            segments.append(Segment(after(header, full, f"turn {i}"), True, images[i]))
        else:
            segments.append(Segment(after(previous, full, f"turn {i}"), False, images[i]))
        previous = full
    return [s for s in segments if s.text or s.images]


def row_segments(row: Row, render: ChatRenderer | None, mask_prompt: bool) -> tuple[list[Segment], bool]:
    """The row's segments, and whether the tokenizer's special affixes (BOS/EOS) go around them.

    ``render`` is needed for ``messages`` rows (see `chat_renderer`).
    """
    if row.kind == "text":
        return [Segment(row.text, True)], True
    if row.kind == "prompt_completion":
        return [Segment(row.prompt, not mask_prompt), Segment(row.completion, True)], True
    if render is None:
        raise JsonlRowError(f"{row.source}: a 'messages' row needs a chat template, and the tokenizer has none "
                            "(set tokenizer.chat_template, or use 'text' or 'prompt'/'completion' rows)")
    return _chat_segments(row, render, mask_prompt), False

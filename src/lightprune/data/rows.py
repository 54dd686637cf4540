"""JSONL rows for the text and image+text datamodules: reading, validation, clear errors.

One JSON object per line, in one of three shapes (blank lines are skipped):

- ``{"text": "..."}``: plain text; every token is a label.
- ``{"prompt": "...", "completion": "..."}``: the prompt's tokens are masked out of the labels.
- ``{"messages": [{"role": "user", "content": "..."}, ...]}``: a conversation rendered with the
  tokenizer's (or processor's) chat template; only assistant turns are labels.

Image rows (image+text datamodule only) add ``"image": "path"`` or ``"images": [...]`` to a
``messages`` row; relative paths are resolved against the JSONL file's folder. An image goes
where its ``<image>`` placeholder stands in a message's text, or, with no placeholder, before
the text of the first user message. Content may also be a list of parts,
``[{"type": "image"}, {"type": "text", "text": "..."}]``, one image part per image.

Any row may carry ``"task": "name"`` (a non-empty string): the task family it belongs to (e.g.
``count``, ``color``), which the image+text datamodule turns into ``task_ids`` (see
`ImageTextJsonlDataModule`); a row without one is of task `DEFAULT_TASK`.

Every error names the file and the line (``path:line``); a missing file names the path, and
a file with no rows is an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightprune.core.jsonio import parse_json
from lightprune.core.parse_limits import DuplicateKeyError, ParseLimitError

__all__ = ["DEFAULT_TASK", "IMAGE_PLACEHOLDER", "JsonlRowError", "Row", "parse_row", "read_jsonl"]

IMAGE_PLACEHOLDER = "<image>"
DEFAULT_TASK = "default"
_PROGRESS_MIN_BYTES = 1 << 20


class JsonlRowError(ValueError):
    """A malformed JSONL line; the message starts with ``path:line:``."""


@dataclass
class Row:
    """One validated line. ``kind`` is ``text``, ``prompt_completion`` or ``messages``."""

    kind: str
    source: str  # "path:line", for error messages
    text: str | None = None
    prompt: str | None = None
    completion: str | None = None
    messages: list[dict[str, Any]] | None = None
    images: list[Path] = field(default_factory=list)
    task: str | None = None


def _fail(source: str, message: str) -> JsonlRowError:
    return JsonlRowError(f"{source}: {message}")


def _string(obj: dict, key: str, source: str) -> str:
    value = obj[key]
    if not isinstance(value, str):
        raise _fail(source, f"{key!r} must be a string, got {type(value).__name__}")
    return value


def _messages(obj: dict, source: str, allow_images: bool) -> list[dict[str, Any]]:
    messages = obj["messages"]
    if not isinstance(messages, list) or not messages:
        raise _fail(source, "'messages' must be a non-empty list of {'role', 'content'} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _fail(source, f"messages[{i}] must be an object with 'role' and 'content', got {type(m).__name__}")
        for key in ("role", "content"):
            if key not in m:
                raise _fail(source, f"messages[{i}] is missing key {key!r}")
        if not isinstance(m["role"], str):
            raise _fail(source, f"messages[{i}]['role'] must be a string")
        content = m["content"]
        if isinstance(content, list):
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text" and isinstance(part.get("text"), str):
                    continue
                if kind == "image" and allow_images:
                    continue
                allowed = "{'type': 'text', 'text': str}" + (" or {'type': 'image'}" if allow_images else "")
                raise _fail(source, f"messages[{i}]['content'][{j}] must be {allowed}, got {part!r}")
        elif not isinstance(content, str):
            raise _fail(source, f"messages[{i}]['content'] must be a string or a list of parts")
    return messages


def _images(obj: dict, source: str, base: Path) -> list[Path]:
    if "image" in obj and "images" in obj:
        raise _fail(source, "give 'image' or 'images', not both")
    raw = obj.get("images", obj.get("image"))
    if raw is None:
        return []
    names = [raw] if "image" in obj else raw
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise _fail(source, "'image' must be a path string and 'images' a list of path strings")
    paths = []
    for name in names:
        path = Path(name).expanduser()
        path = path if path.is_absolute() else base / path
        if not path.is_file():
            raise FileNotFoundError(f"{source}: image {name!r} not found (looked for {path})")
        paths.append(path)
    return paths


def _check_unicode(value: Any, source: str, where: str = "") -> None:
    """Every string in ``value`` must be valid Unicode text (JSON escapes can spell a lone surrogate)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            bad = value[e.start:e.end].encode("unicode_escape").decode()
            raise _fail(source, f"{where or 'a string'} holds {bad}, a lone surrogate (not Unicode text; "
                                f"at character {e.start})") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_unicode(item, source, f"{where}[{key!r}]" if where else repr(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_unicode(item, source, f"{where}[{i}]")


def parse_row(obj: Any, source: str, base: Path, allow_images: bool) -> Row:
    """Validate one decoded line and return its `Row`."""
    if not isinstance(obj, dict):
        raise _fail(source, f"expected a JSON object, got {type(obj).__name__}")
    _check_unicode(obj, source)
    has_image = "image" in obj or "images" in obj
    if has_image and not allow_images:
        raise _fail(source, "has an image, but this datamodule reads text only; use ImageTextJsonlDataModule")
    if "messages" in obj:
        row = Row("messages", source, messages=_messages(obj, source, allow_images))
    elif "prompt" in obj or "completion" in obj:
        for key in ("prompt", "completion"):
            if key not in obj:
                raise _fail(source, f"missing key {key!r} (a prompt/completion row needs both)")
        row = Row("prompt_completion", source, prompt=_string(obj, "prompt", source),
                  completion=_string(obj, "completion", source))
    elif "text" in obj:
        row = Row("text", source, text=_string(obj, "text", source))
    else:
        raise _fail(source, f"missing key: expected 'text', 'prompt' and 'completion', or 'messages'; "
                            f"got keys {sorted(obj)}")
    if "task" in obj:
        task = obj["task"]
        if not isinstance(task, str) or not task:
            raise _fail(source, f"'task' must be a non-empty string, got {task!r}")
        row.task = task
    if has_image:
        if row.kind != "messages":
            raise _fail(source, "an image row needs 'messages' (the image goes into a user turn)")
        row.images = _images(obj, source, base)
        _check_image_slots(row)
    return row


def _check_image_slots(row: Row) -> None:
    parts = sum(1 for m in row.messages if isinstance(m["content"], list)
                for p in m["content"] if p.get("type") == "image")
    holders = sum(m["content"].count(IMAGE_PLACEHOLDER) for m in row.messages if isinstance(m["content"], str))
    slots = parts + holders
    if slots and slots != len(row.images):
        raise _fail(row.source, f"{len(row.images)} image(s) but {slots} image slot(s) "
                                f"({IMAGE_PLACEHOLDER!r} placeholders and image parts) in the messages")
    if not slots and row.images and not any(m["role"] == "user" for m in row.messages):
        raise _fail(row.source, "an image row without placeholders needs a 'user' message to put the image in")


def read_jsonl(path: str | Path, *, limit: int | None = None, allow_images: bool = False,
               progress: bool | None = None, desc: str | None = None) -> list[Row]:
    """Read and validate the rows of a JSONL file (the first ``limit`` rows, when given).

    ``progress``: show a progress bar over the file's bytes (``None``: for files over 1 MiB).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"JSONL file {str(path)!r} does not exist")
    size = path.stat().st_size
    show = size >= _PROGRESS_MIN_BYTES if progress is None else progress
    bar = None
    if show:
        from lightning.pytorch.utilities.rank_zero import rank_zero_only
        from tqdm.auto import tqdm

        bar = tqdm(total=size, unit="B", unit_scale=True, desc=desc or f"reading {path.name}",
                   disable=rank_zero_only.rank != 0, leave=False)
    rows: list[Row] = []
    base = path.parent
    try:
        with path.open("rb") as f:
            for number, raw in enumerate(f, start=1):
                if bar is not None:
                    bar.update(len(raw))
                if limit is not None and len(rows) >= limit:
                    break
                if not raw.strip():
                    continue
                source = f"{path}:{number}"
                try:
                    obj = parse_json(raw.decode("utf-8"), source)
                except (DuplicateKeyError, ParseLimitError) as e:
                    raise JsonlRowError(str(e)) from None
                except UnicodeDecodeError as e:
                    raise JsonlRowError(f"{source}: not UTF-8 text ({e.reason})") from None
                except json.JSONDecodeError as e:
                    raise JsonlRowError(f"{source}: not valid JSON ({e.msg} at column {e.colno})") from None
                rows.append(parse_row(obj, source, base, allow_images))
    finally:
        if bar is not None:
            bar.close()
    if not rows:
        raise ValueError(f"JSONL file {str(path)!r} is empty (no rows)")
    return rows

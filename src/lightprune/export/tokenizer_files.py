"""The tokenizer / processor of an export and the source's generation config: a given processor saved
(``save_pretrained``), or else the tokenizer, processor and chat-template files of the source checkpoint directory
copied by name (`TOKENIZER_FILES`; never weights, never code: a foreign
``auto_map`` in a copied JSON file is dropped with the code it points at); ``generation_config.json`` copied from the
source when the export wrote none. Neither a processor nor tokenizer files: none is invented (the manifest says
``"tokenizer": null``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from lightprune.checkpoints.directory import GENERATION_FILE, copied_files
from lightprune.core.jsonio import parse_json

__all__ = ["copy_tokenizer_files", "write_tokenizer", "copy_generation_config"]


def _copy_dropping_auto_map(src: Path, dst: Path) -> None:
    if src.suffix == ".json":
        try:
            data = parse_json(src.read_text(), f"source file {str(src)!r}")
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"source file {str(src)!r} is not valid JSON: {err}") from None
        if isinstance(data, dict) and "auto_map" in data:  # points at source code the export does not carry
            data.pop("auto_map")
            dst.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
            return
    shutil.copyfile(src, dst)


def copy_tokenizer_files(source: Path, tmp: Path) -> list[str]:
    """Copy the tokenizer, processor and chat-template files of ``source`` (`TOKENIZER_FILES`, the templates of
    ``additional_chat_templates``) into ``tmp``; their names. One that is no regular file is refused
    (`copied_files`), never skipped."""
    names = [name for name in copied_files(source) if name != GENERATION_FILE]
    for name in names:
        (tmp / name).parent.mkdir(exist_ok=True)
        _copy_dropping_auto_map(source / name, tmp / name)
    return sorted(names)


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def write_tokenizer(tmp: Path, processor: Any, source: Path | None) -> dict[str, Any] | None:
    """Save ``processor`` or copy the source's tokenizer files; the manifest's ``tokenizer`` entry."""
    if processor is not None:
        before = _files(tmp)
        processor.save_pretrained(tmp)
        return {"origin": "processor", "class": type(processor).__name__, "files": sorted(_files(tmp) - before)}
    copied = copy_tokenizer_files(source, tmp) if source is not None else []
    return {"origin": "source_dir", "files": copied} if copied else None


def copy_generation_config(source: Path | None, tmp: Path) -> None:
    """``generation_config.json`` of ``source`` into ``tmp`` when ``tmp`` has none (``save_pretrained`` writes one
    only for a model that holds a generation config)."""
    if source is not None and not (tmp / GENERATION_FILE).exists() and (source / GENERATION_FILE).is_file():
        shutil.copyfile(source / GENERATION_FILE, tmp / GENERATION_FILE)

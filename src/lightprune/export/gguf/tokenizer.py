"""The tokenizer of an export, whose vocabulary llama.cpp's converter writes into the GGUF: checked before the converter
runs (`check_tokenizer`), and whether it declares GPT-2's byte-level pre-tokenization (`gpt2_byte_level`),
which names the ``gpt-2`` pre-tokenizer for one the converter does not know."""

from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path
from typing import Any

from lightprune.checkpoints.directory import read_config
from lightprune.core.jsonio import read_json, show
from lightprune.core.notices import verbose
from lightprune.export.gguf.run import described

__all__ = ["check_tokenizer", "gpt2_byte_level"]


def gpt2_byte_level(tokenizer_json: str | os.PathLike) -> bool:
    """True when ``tokenizer.json`` declares GPT-2's pre-tokenization: a byte-level BPE, a ``ByteLevel``
    pre-tokenizer with its regex and without a prefix space, and no normaliser."""
    spec = read_json(tokenizer_json, "tokenizer")
    if not isinstance(spec, dict):
        raise ValueError(f"tokenizer file {str(tokenizer_json)!r} is not a JSON object")
    pre, model = spec.get("pre_tokenizer") or {}, spec.get("model") or {}
    return (spec.get("normalizer") is None and isinstance(model, dict) and model.get("type") == "BPE"
            and isinstance(pre, dict) and pre.get("type") == "ByteLevel" and pre.get("use_regex", True) is True
            and not pre.get("add_prefix_space"))



#: the files a vocabulary is read from: transformers' (tokenizer.json; vocab.json with merges.txt), sentencepiece's
_VOCABULARIES = ("tokenizer.json", "tokenizer.model", "vocab.json")
#: the tokenizer's JSON files that the converter (or transformers, for it) parses when they are there
_TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "added_tokens.json", "special_tokens_map.json",
                   "chat_template.json", "vocab.json")
#: config.json's special token ids, which the converter writes into the GGUF
_SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
_RESTORE = "restore it from the model the export was pruned from (tokenizer.save_pretrained(EXPORT))"


def _token_id(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _check_ids(file: Path, pairs: list[tuple[Any, Any]], vocab_size: int | None, where: str) -> None:
    """``pairs`` of (token, id) read from ``file`` (``where``: the field): ids that are integers from 0, one token per
    id, every id below ``vocab_size``."""
    seen: dict[int, Any] = {}
    for token, value in pairs:
        index = _token_id(value)
        if index is None or not isinstance(token, str):
            raise ValueError(f"tokenizer file {str(file)!r}: {where} gives {show(token)} the id {show(value)}, not a "
                             f"token (a string) with an id (an integer from 0); {_RESTORE}")
        if seen.setdefault(index, token) != token:
            raise ValueError(f"tokenizer file {str(file)!r}: {where} gives the id {index} to two tokens "
                             f"({show(seen[index])} and {show(token)}), and a GGUF's vocabulary holds one token per "
                             f"id (the converter would keep one, silently); {_RESTORE}")
    past = sorted(index for index in seen if vocab_size is not None and index >= vocab_size)
    if past:
        raise ValueError(f"tokenizer file {str(file)!r}: {where} has {len(past)} token(s) at ids {vocab_size} and "
                         f"above (the last: {show(seen[past[-1]])} at {past[-1]}), past config.json's vocab_size "
                         f"{vocab_size}, the model's embedding rows: it is another model's tokenizer; save the "
                         "tokenizer of the model the export was pruned from into it")


def _sentencepiece_pieces(data: bytes) -> int:
    """How many pieces a sentencepiece model holds (the entries of its ``ModelProto``'s field 1); ValueError when the
    bytes are not a protobuf message."""

    def varint(at: int) -> tuple[int, int]:
        value = 0
        for shift in range(0, 64, 7):
            if at >= len(data):
                break
            byte = data[at]
            value, at = value | (byte & 0x7F) << shift, at + 1
            if byte < 0x80:
                return value, at
        raise ValueError("a truncated varint")

    at = count = 0
    while at < len(data):
        key, at = varint(at)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, at = varint(at)
        elif wire == 2:
            size, at = varint(at)
            at += size
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire}")
        if field == 0 or at > len(data):
            raise ValueError("a field past the end")
        count += field == 1 and wire == 2
    return count


def _json_object(file: Path) -> dict[str, Any]:
    try:
        record = read_json(file, "tokenizer")
    except ValueError as err:
        raise ValueError(f"{err}; {_RESTORE}") from err
    if not isinstance(record, dict):
        raise ValueError(f"tokenizer file {str(file)!r} is not a JSON object; {_RESTORE}")
    return record


def _check_tokenizer_json(file: Path, spec: dict[str, Any], vocab_size: int | None) -> None:
    """tokenizer.json: a model with a vocabulary (a BPE's with merges), its added tokens, its ids."""
    model = spec.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if not vocab or not isinstance(vocab, (dict, list)):
        raise ValueError(f"tokenizer file {str(file)!r} has no vocabulary (its model.vocab is missing or empty), "
                         f"which llama.cpp's converter writes into the GGUF; {_RESTORE}")
    if isinstance(vocab, dict):
        pairs = list(vocab.items())
    else:  # a Unigram's [piece, score] list: the id is the position
        pairs = [(entry[0] if isinstance(entry, list) and entry else entry, i) for i, entry in enumerate(vocab)]
    _check_ids(file, pairs, vocab_size, "model.vocab")
    if model.get("type") == "BPE" and not model.get("merges") and not (file.parent / "merges.txt").is_file():
        raise ValueError(f"tokenizer file {str(file)!r} is a BPE without merges (its model.merges is empty, and "
                         f"there is no merges.txt): a GGUF of it would not tokenize; {_RESTORE}")
    added = spec.get("added_tokens")
    if not isinstance(added, list) or not all(isinstance(entry, dict) for entry in added):
        raise ValueError(f"tokenizer file {str(file)!r} has no added_tokens list (of {{\"id\": ..., \"content\": "
                         f"...}}), which transformers needs to read it; {_RESTORE}")
    added_pairs = [(entry.get("content"), entry.get("id")) for entry in added]
    _check_ids(file, added_pairs, vocab_size, "added_tokens")
    known = set(pairs)  # an added token that is the vocabulary's own entry (a special token): once
    _check_ids(file, pairs + [pair for pair in added_pairs if pair not in known], vocab_size,
               "model.vocab with added_tokens")


def check_tokenizer(export: str | os.PathLike) -> None:
    """Refuse, in one line naming the file, a tokenizer llama.cpp's converter would fail on or convert wrongly: none
    (no tokenizer.json, tokenizer.model or vocab.json), a JSON file that does not parse, no vocabulary, a BPE without
    merges, an id given to two tokens, an id (the vocabulary's, an added token's, config.json's special ones) at or
    past config.json's ``vocab_size``, a sentencepiece model without the sentencepiece package, a tokenizer.json that
    transformers' AutoTokenizer (which the converter reads it with) does not load."""
    export = Path(export)
    config = read_config(export)
    merged = {**config, **config["text_config"]} if isinstance(config.get("text_config"), dict) else config
    vocab_size = _token_id(merged.get("vocab_size")) or None
    if not any((export / name).is_file() for name in _VOCABULARIES):
        raise ValueError(f"export {str(export)!r} has no tokenizer (no {', '.join(_VOCABULARIES)}), whose vocabulary "
                         "llama.cpp's converter writes into the GGUF; save the tokenizer of the model it was pruned "
                         "from into it (tokenizer.save_pretrained(EXPORT), or lp.export_pruned(..., "
                         "processor=tokenizer))")
    specs = {name: _json_object(export / name) for name in _TOKENIZER_JSON if (export / name).is_file()}
    if "tokenizer.json" in specs:
        _check_tokenizer_json(export / "tokenizer.json", specs["tokenizer.json"], vocab_size)
    if "vocab.json" in specs:
        _check_ids(export / "vocab.json", list(specs["vocab.json"].items()), vocab_size, "the vocabulary")
    if "added_tokens.json" in specs:
        _check_ids(export / "added_tokens.json", list(specs["added_tokens.json"].items()), vocab_size,
                   "the added tokens")
    decoder = specs.get("tokenizer_config.json", {}).get("added_tokens_decoder") or {}
    file = export / "tokenizer_config.json"
    if not isinstance(decoder, dict) or not all(isinstance(entry, dict) for entry in decoder.values()):
        raise ValueError(f"tokenizer file {str(file)!r}: added_tokens_decoder is not {{id: {{\"content\": ...}}}}; "
                         f"{_RESTORE}")
    _check_ids(file, [(entry.get("content"), int(key) if key.isdigit() else key) for key, entry in decoder.items()],
               vocab_size, "added_tokens_decoder")
    for key in _SPECIAL_IDS:
        values = merged.get(key) if isinstance(merged.get(key), list) else [merged.get(key)]
        past = [value for value in values if vocab_size is not None and _token_id(value) is not None and
                value >= vocab_size]
        if past:
            raise ValueError(f"config.json {str(export / 'config.json')!r} has {key} {past[0]}, past its vocab_size "
                             f"{vocab_size}: the GGUF would name a token the model does not have; correct it")
    if (export / "tokenizer.model").is_file():
        _check_sentencepiece(export / "tokenizer.model", vocab_size, only=not specs.keys() & {"tokenizer.json",
                                                                                             "vocab.json"})
    if "tokenizer.json" in specs or "vocab.json" in specs:
        _check_loads(export, vocab_size)


def _check_sentencepiece(file: Path, vocab_size: int | None, only: bool) -> None:
    """tokenizer.model: a sentencepiece model of at most ``vocab_size`` pieces; the package that reads it, when it is
    the export's ``only`` vocabulary."""
    try:
        pieces = _sentencepiece_pieces(file.read_bytes())
    except (OSError, ValueError) as err:
        raise ValueError(f"tokenizer file {str(file)!r} is not a sentencepiece model ({err}); {_RESTORE}") from None
    if not pieces:
        raise ValueError(f"tokenizer file {str(file)!r} holds no pieces: a sentencepiece model without a vocabulary; "
                         f"{_RESTORE}")
    if vocab_size is not None and pieces > vocab_size:
        raise ValueError(f"tokenizer file {str(file)!r} holds {pieces} pieces, more than config.json's vocab_size "
                         f"{vocab_size}, the model's embedding rows (the converter would drop the ones past it): it "
                         "is another model's tokenizer; save the tokenizer of the model the export was pruned from "
                         "into it")
    if only and importlib.util.find_spec("sentencepiece") is None:
        raise ValueError(f"the tokenizer of export {str(file.parent)!r} is a sentencepiece model (tokenizer.model), "
                         "which llama.cpp's converter reads with the sentencepiece package, not installed here; "
                         "install it (pip install -e '.[deploy]', which brings it), or save the tokenizer's "
                         "tokenizer.json into the export")


def _check_loads(export: Path, vocab_size: int | None) -> None:
    """The tokenizer as the converter reads it (``AutoTokenizer.from_pretrained``), and its ids below ``vocab_size``
    (the converter's ``assert``)."""
    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        if not verbose():
            warnings.simplefilter("ignore")
        try:
            tokenizer = AutoTokenizer.from_pretrained(export)
            vocab = tokenizer.get_vocab()
        except Exception as err:  # noqa: BLE001 - whatever transformers says, in one line
            raise ValueError(f"the tokenizer of export {str(export)!r} does not load with transformers' AutoTokenizer, "
                             f"which llama.cpp's converter reads it with: {described(err)}; {_RESTORE}") from err
    last = max(vocab.items(), key=lambda item: item[1], default=None)
    if last is not None and vocab_size is not None and last[1] >= vocab_size:
        raise ValueError(f"the tokenizer of export {str(export)!r} has the token {show(last[0])} at id {last[1]}, past "
                         f"config.json's vocab_size {vocab_size}, the model's embedding rows: it is another model's "
                         "tokenizer; save the tokenizer of the model the export was pruned from into it")

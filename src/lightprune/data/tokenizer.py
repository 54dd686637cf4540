"""Local byte-level BPE tokenizers, trained with the ``tokenizers`` library (nothing downloaded).

`train_bpe_tokenizer` trains a GPT-2-style byte-level BPE on an iterable of texts and
wraps it in a `transformers.PreTrainedTokenizerFast` that saves and loads with
``save_pretrained`` / ``from_pretrained`` on a local directory (``AutoTokenizer`` too).

Special tokens: pad, eos, bos and unk, the ChatML turn markers (``<|im_start|>``,
``<|im_end|>``) and, on request, image placeholders (``<image>``, ``<|vision_start|>``,
``<|vision_end|>``, ``<|image_pad|>``, ``<|video_pad|>``). ``token_ids`` pins any special token
to an exact id, so that a tokenizer can match a model config's ids (a tiny Qwen3-VL config has
``image_token_id=120`` in a vocabulary of 128, for example); the other special tokens take the
lowest free ids and the learned tokens fill the rest in the order BPE learned them.

Alphabet: with room for it (``vocab_size >= 256 + specials``) the 256 byte symbols are all in
the vocabulary, so any text encodes losslessly. Tiny vocabularies cannot hold them; then the
alphabet is the byte symbols of ``keep_chars`` (space and newline) and those seen in the
training texts (most frequent first, ties by symbol), and any other byte encodes as the unk
token.

Training is deterministic: same texts and arguments, same vocabulary, merges and ids.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "CHATML_TEMPLATE",
    "CHATML_TEXT_TEMPLATE",
    "CHAT_TOKENS",
    "END_OF_TURN_TOKENS",
    "IMAGE_TOKENS",
    "chatml_template",
    "end_of_turn_ids",
    "template_tokens_missing",
    "train_bpe_tokenizer",
]

CHAT_TOKENS: tuple[str, ...] = ("<|im_start|>", "<|im_end|>")
IMAGE_TOKENS: tuple[str, ...] = ("<image>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")

#: ChatML for text: the turn markers only; a content list's parts must be text
CHATML_TEXT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] != 'text' %}{{ raise_exception('this tokenizer has no ' + part['type'] + ' tokens') }}{% endif %}"
    "{{ part['text'] }}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant' + '\\n' }}{% endif %}"
)
# ChatML, with Qwen-VL style content lists: {"type": "image"} -> <|vision_start|><|image_pad|><|vision_end|>
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'video' %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant' + '\\n' }}{% endif %}"
)
_BYTES = 256
#: a special-token literal in a chat template: <|name|>, <image>, <video>
_TEMPLATE_TOKEN = re.compile(r"<\|[^|<>'\"\s]+\|>|<image>|<video>")

#: the end-of-turn markers of common chat templates (ChatML, Llama 3, Gemma, Phi)
END_OF_TURN_TOKENS: tuple[str, ...] = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")


def template_tokens_missing(template: str, vocab: Mapping[str, int]) -> list[str]:
    """The special-token literals (``<|name|>``, ``<image>``, ``<video>``) that ``template`` writes and ``vocab``
    lacks, sorted: a template that writes them would feed the model their characters as plain text."""
    return sorted({t for t in _TEMPLATE_TOKEN.findall(template) if t not in vocab})


def chatml_template(vocab: Mapping[str, int]) -> str | None:
    """The ChatML template that ``vocab`` can write: with Qwen-VL's image and video parts
    (`CHATML_TEMPLATE`) when it has their tokens, else the text one (`CHATML_TEXT_TEMPLATE`);
    ``None`` without the turn markers (`CHAT_TOKENS`)."""
    for template in (CHATML_TEMPLATE, CHATML_TEXT_TEMPLATE):
        if not template_tokens_missing(template, vocab):
            return template
    return None


def end_of_turn_ids(owner) -> tuple[int, ...]:
    """The ids of `END_OF_TURN_TOKENS` in the vocabulary of ``owner``: a tokenizer, a processor (its
    ``tokenizer``) or a datamodule (its ``processor`` or ``tokenizer``), sorted; empty when it has none of them or
    ``owner`` holds no tokenizer."""
    for _ in range(3):
        if owner is None or callable(getattr(owner, "get_vocab", None)):
            break
        owner = getattr(owner, "processor", None) or getattr(owner, "tokenizer", None)
    if owner is None or not callable(getattr(owner, "get_vocab", None)):
        return ()
    vocab = owner.get_vocab()
    return tuple(sorted(vocab[t] for t in END_OF_TURN_TOKENS if t in vocab))


def _ordered_unique(tokens: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for t in tokens:
        seen.setdefault(t, None)
    return list(seen)


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    special_tokens: Sequence[str] = CHAT_TOKENS,
    *,
    image_tokens: bool | Sequence[str] = False,
    token_ids: Mapping[str, int] | None = None,
    pad_token: str = "<|pad|>",
    eos_token: str = "<|endoftext|>",
    bos_token: str = "<|bos|>",
    unk_token: str = "<|unk|>",
    min_frequency: int = 1,
    byte_alphabet: bool | None = None,
    keep_chars: str = " \n",
    chat_template: str | None = "chatml",
    model_max_length: int = 4096,
):
    """Train a byte-level BPE tokenizer on ``texts``; return a ``PreTrainedTokenizerFast``.

    Args:
        texts: training texts (any iterable; read once).
        vocab_size: size of the vocabulary, special tokens included. The result has exactly this
            many ids when the texts hold enough merges; a small corpus gives fewer learned tokens,
            and then ``len(tokenizer)`` is smaller (gaps below a pinned id are filled with
            ``<|reserved_N|>`` special tokens, so ids stay contiguous).
        special_tokens: extra special tokens (default: the ChatML turn markers).
        image_tokens: add `IMAGE_TOKENS` (``True``) or the given placeholder tokens.
        token_ids: exact ids for some special tokens, e.g. ``{"<|image_pad|>": 120}``; every
            other special token takes the lowest free id, in the order pad, eos, bos, unk,
            ``special_tokens``, image tokens.
        pad_token, eos_token, bos_token, unk_token: the role tokens.
        min_frequency: a pair must occur this often to be merged.
        byte_alphabet: keep all 256 byte symbols (lossless on any text). ``None``: when the
            vocabulary has room for them.
        keep_chars: without the full byte alphabet, the byte symbols of these characters are
            kept even when the texts lack them (default: space and newline, which chat
            templates add).
        chat_template: Jinja chat template stored with the tokenizer; ``"chatml"`` (default):
            `chatml_template` of the special tokens (none without the turn markers); ``None`` for
            none. A template naming a special token (``<|...|>``, ``<image>``, ``<video>``) that the
            vocabulary lacks is refused.
        model_max_length: stored as the tokenizer's ``model_max_length``.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if image_tokens is True:
        image_tokens = IMAGE_TOKENS
    elif image_tokens is False:
        image_tokens = ()
    specials = _ordered_unique([pad_token, eos_token, bos_token, unk_token, *special_tokens, *image_tokens])
    pinned = dict(token_ids or {})
    unknown = sorted(set(pinned) - set(specials))
    if unknown:
        raise ValueError(f"token_ids pins {unknown}, which are not special tokens of this tokenizer; "
                         f"the special tokens are {specials}")
    if len(set(pinned.values())) != len(pinned):
        raise ValueError(f"token_ids gives two tokens the same id: {pinned}")
    bad = {t: i for t, i in pinned.items() if not 0 <= i < vocab_size}
    if bad:
        raise ValueError(f"token_ids {bad} lie outside [0, vocab_size={vocab_size})")
    budget = vocab_size - len(specials)
    if budget < 2:
        raise ValueError(f"vocab_size={vocab_size} leaves no room for learned tokens beside "
                         f"{len(specials)} special tokens")
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be >= 1, got {min_frequency}")

    texts = [t for t in texts]
    bad_types = [type(t).__name__ for t in texts if not isinstance(t, str)]
    if bad_types:
        raise TypeError(f"texts must be strings; got {sorted(set(bad_types))}")
    if not any(texts):
        raise ValueError("train_bpe_tokenizer needs at least one non-empty text")

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    full = budget >= _BYTES if byte_alphabet is None else bool(byte_alphabet)
    if full and budget < _BYTES:
        raise ValueError(f"byte_alphabet=True needs vocab_size >= {_BYTES + len(specials)} "
                         f"(256 bytes + {len(specials)} special tokens), got {vocab_size}")
    if full:
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        # the most frequent byte symbols of the texts, ties broken by symbol: deterministic
        counts: Counter[str] = Counter()
        keep = {c for piece, _ in byte_level.pre_tokenize_str(keep_chars) for c in piece} if keep_chars else set()
        for text in texts:
            for piece, _ in byte_level.pre_tokenize_str(text):
                counts.update(piece)
        ranked = [c for c, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if c not in keep]
        alphabet = (sorted(keep) + ranked)[:budget]

    tok = Tokenizer(models.BPE(unk_token=None if full else unk_token))
    tok.pre_tokenizer = byte_level
    trainer = trainers.BpeTrainer(vocab_size=budget, min_frequency=min_frequency, show_progress=False,
                                  special_tokens=[], initial_alphabet=sorted(alphabet),
                                  limit_alphabet=len(alphabet))
    tok.train_from_iterator(texts, trainer)
    learned = json.loads(tok.to_str())["model"]
    learned_tokens = [t for t, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1])]

    # ids: pinned specials, then the other specials at the lowest free ids, then learned tokens
    vocab: dict[str, int] = dict(pinned)
    taken = set(pinned.values())
    free = (i for i in range(vocab_size * 2 + len(learned_tokens)) if i not in taken)
    for token in specials:
        if token not in vocab:
            vocab[token] = next(free)
    for token in learned_tokens:
        if token not in vocab:
            vocab[token] = next(free)
    # fill gaps (below a pinned id, when the corpus gave too few merges) with reserved specials
    used = set(vocab.values())
    reserved = []
    for i in range(max(used) + 1):
        if i not in used:
            name = f"<|reserved_{i}|>"
            vocab[name] = i
            reserved.append(name)
    ordered = dict(sorted(vocab.items(), key=lambda kv: kv[1]))

    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in learned["merges"]]
    model = models.BPE(vocab=ordered, merges=merges, unk_token=None if full else unk_token)
    final = Tokenizer(model)
    final.pre_tokenizer = byte_level
    final.decoder = decoders.ByteLevel()
    final.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in [*specials, *reserved]])

    kwargs = {"tokenizer_object": final, "pad_token": pad_token, "eos_token": eos_token, "bos_token": bos_token,
              "unk_token": unk_token, "model_max_length": model_max_length, "padding_side": "right"}
    extras = [t for t in specials if t not in (pad_token, eos_token, bos_token, unk_token)]
    if extras:
        kwargs["additional_special_tokens"] = extras
    hf = PreTrainedTokenizerFast(**kwargs)
    if chat_template == "chatml":
        chat_template = chatml_template(hf.get_vocab())
    elif chat_template is not None:
        missing = template_tokens_missing(chat_template, hf.get_vocab())
        if missing:
            raise ValueError(f"chat_template names {missing}, which the vocabulary does not have; add them to "
                             f"special_tokens or image_tokens, or pass another template")
    if chat_template is not None:
        hf.chat_template = chat_template
    wrong = {t: (hf.convert_tokens_to_ids(t), i) for t, i in pinned.items() if hf.convert_tokens_to_ids(t) != i}
    if wrong:  # pragma: no cover - guards against a tokenizers/transformers change
        raise RuntimeError(f"pinned token ids were not kept (token: (got, wanted)): {wrong}")
    return hf

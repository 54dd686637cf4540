"""The chat template a trained tokenizer carries names only tokens of its vocabulary (data.tokenizer)."""

from __future__ import annotations

import pytest
from jinja2.exceptions import TemplateError

from lightprune.data.tokenizer import (
    CHATML_TEMPLATE,
    CHATML_TEXT_TEMPLATE,
    chatml_template,
    template_tokens_missing,
    train_bpe_tokenizer,
)

TEXTS = ["the cat sat on the mat", "a dog and a cat"] * 4
CHAT = [{"role": "user", "content": "hi"}]


def _ids_of_specials(tokenizer, text: str) -> list[int]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    special = set(tokenizer.all_special_ids)
    return [i for i in ids if i in special]


def test_text_tokenizer_gets_text_chatml_whose_markers_are_single_tokens() -> None:
    tok = train_bpe_tokenizer(TEXTS, 300)
    assert tok.chat_template == CHATML_TEXT_TEMPLATE
    assert template_tokens_missing(tok.chat_template, tok.get_vocab()) == []
    rendered = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"  # ChatML, written out
    start, end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    assert _ids_of_specials(tok, rendered) == [start, end, start]
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": " you"}]}]
    assert tok.apply_chat_template(parts, tokenize=False) == "<|im_start|>user\nhi you<|im_end|>\n"
    with pytest.raises(TemplateError, match="no image tokens"):
        tok.apply_chat_template([{"role": "user", "content": [{"type": "image"}]}], tokenize=False)


def test_the_vision_template_only_with_its_tokens() -> None:
    tok = train_bpe_tokenizer(TEXTS, 300, image_tokens=True)
    assert tok.chat_template == CHATML_TEMPLATE
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]}]
    assert tok.apply_chat_template(chat, tokenize=False) == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>what?<|im_end|>\n")
    # the former default on a text vocabulary: the four vision literals are what it lacked
    assert template_tokens_missing(CHATML_TEMPLATE, train_bpe_tokenizer(TEXTS, 300).get_vocab()) == [
        "<|image_pad|>", "<|video_pad|>", "<|vision_end|>", "<|vision_start|>"]


def test_no_turn_markers_no_template_and_a_foreign_template_is_refused() -> None:
    plain = train_bpe_tokenizer(TEXTS, 300, special_tokens=())
    assert plain.chat_template is None and chatml_template(plain.get_vocab()) is None
    with pytest.raises(ValueError, match=r"\['<\|vision_end\|>', '<\|vision_start\|>'\]"):
        train_bpe_tokenizer(TEXTS, 300, chat_template="{{ '<|vision_start|>' }}{{ '<|im_start|>' }}{{ '<|vision_end|>' }}")
    own = "{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}"
    assert train_bpe_tokenizer(TEXTS, 300, chat_template=own).chat_template == own

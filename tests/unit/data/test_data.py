"""Data: local BPE tokenizers, text and image+text JSONL datamodules, the tiny Qwen3-VL processor."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from fixtures import FIXTURES

from lightprune.data import (
    ImageTextJsonlDataModule,
    JsonlRowError,
    TextJsonlDataModule,
    tiny_qwen3_vl_processor,
    train_bpe_tokenizer,
)

DATA = FIXTURES / "data"
TEXT_JSONL = DATA / "text.jsonl"
ROWS = [json.loads(line) for line in TEXT_JSONL.read_text().splitlines()]
VISION_IDS = {"<|image_pad|>": 120, "<|video_pad|>": 121, "<|vision_start|>": 122, "<|vision_end|>": 123}


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _corpus() -> list[str]:
    out = []
    for r in ROWS:
        out += [r.get("text", ""), r.get("prompt", ""), r.get("completion", "")]
        out += [m["content"] for m in r.get("messages", [])]
    return [t for t in out if t]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok")
    train_bpe_tokenizer(_corpus(), 400).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)


def _real(batch, i):
    return batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()


def _all_batches(loader):
    return [b for b in loader]


# -- tokenizer ---------------------------------------------------------------------------------------

def test_tokenizer_round_trip_specials_and_local_save(tokenizer_dir, tokenizer) -> None:
    for text in _corpus():
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
    for token in ("<|pad|>", "<|endoftext|>", "<|bos|>", "<|im_start|>", "<|im_end|>"):
        assert tokenizer(token, add_special_tokens=False)["input_ids"] == [tokenizer.convert_tokens_to_ids(token)]
    assert tokenizer.pad_token == "<|pad|>" and tokenizer.eos_token == "<|endoftext|>"
    assert len(tokenizer) <= 400
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_end_of_turn_ids_of_a_tokenizer_processor_or_datamodule(tokenizer) -> None:
    from types import SimpleNamespace

    from lightprune.data.tokenizer import end_of_turn_ids

    expected = (tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    processor = SimpleNamespace(tokenizer=tokenizer)
    assert end_of_turn_ids(tokenizer) == expected and end_of_turn_ids(processor) == expected
    assert end_of_turn_ids(SimpleNamespace(processor=processor)) == expected
    assert end_of_turn_ids(SimpleNamespace(tokenizer=tokenizer)) == expected
    assert end_of_turn_ids(None) == () and end_of_turn_ids(SimpleNamespace()) == ()
    plain = train_bpe_tokenizer(_corpus(), 400, special_tokens=())
    assert end_of_turn_ids(plain) == ()


def test_tokenizer_is_deterministic_and_pins_ids() -> None:
    texts = ["the cat sat on the mat", "a dog and a cat", "what is in the image?"] * 3
    kw = dict(image_tokens=True, token_ids=VISION_IDS)
    a, b = train_bpe_tokenizer(texts, 128, **kw), train_bpe_tokenizer(texts, 128, **kw)
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    assert {t: a.convert_tokens_to_ids(t) for t in VISION_IDS} == VISION_IDS
    vocab = a.get_vocab()
    assert max(vocab.values()) < 128 and sorted(vocab.values()) == list(range(len(vocab)))
    # a tiny vocabulary cannot hold all 256 bytes: unseen characters become unk, seen ones round-trip
    assert a.decode(a("the cat\nsat", add_special_tokens=False)["input_ids"]) == "the cat\nsat"
    assert "<|unk|>" in a.decode(a("zebra", add_special_tokens=False)["input_ids"])
    ids = a("<|vision_start|><|image_pad|><|vision_end|>", add_special_tokens=False)["input_ids"]
    assert ids == [122, 120, 123]


@pytest.mark.parametrize("kwargs, match", [
    (dict(token_ids={"<|pad|>": 500}), "outside"),
    (dict(token_ids={"<nope>": 3}), "not special tokens"),
    (dict(token_ids={"<|pad|>": 5, "<|bos|>": 5}), "same id"),
    (dict(byte_alphabet=True), "256 bytes"),
])
def test_tokenizer_argument_errors(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        train_bpe_tokenizer(["some text"], 128, **kwargs)


# -- text datamodule ---------------------------------------------------------------------------------

def test_text_rows_round_trip_with_right_and_left_padding(tmp_path, tokenizer_dir, tokenizer) -> None:
    texts = [r["text"] for r in ROWS if "text" in r]
    path = _write(tmp_path / "t.jsonl", [{"text": t} for t in texts])
    for side in ("right", "left"):
        dm = TextJsonlDataModule(str(tokenizer_dir), calibration=str(path), batch_size=3, padding_side=side)
        batches = _all_batches(dm.calibration_dataloader())
        decoded, i = [], 0
        for batch in batches:
            assert set(batch) == {"input_ids", "attention_mask", "labels"}
            for row in range(len(batch["input_ids"])):
                mask = batch["attention_mask"][row]
                n = int(mask.sum())
                expected = tokenizer(texts[i], add_special_tokens=False)["input_ids"]
                assert _real(batch, row) == expected
                # padding on the chosen side, with the pad id, labels -100 there
                real = slice(0, n) if side == "right" else slice(len(mask) - n, None)
                pad = slice(n, None) if side == "right" else slice(0, len(mask) - n)
                assert mask[real].all() and not mask[pad].any()
                assert (batch["input_ids"][row][pad] == tokenizer.pad_token_id).all()
                assert (batch["labels"][row][pad] == -100).all()
                # a text row is all labels, except its first token (nothing predicts it)
                labels = batch["labels"][row][real].tolist()
                assert labels == [-100] + expected[1:]
                decoded.append(tokenizer.decode(_real(batch, row)))
                i += 1
        assert decoded == texts


def test_prompt_completion_labels_mask_the_prompt_token_by_token(tmp_path, tokenizer) -> None:
    rows = [r for r in ROWS if "prompt" in r]
    dm = TextJsonlDataModule(tokenizer, train=str(_write(tmp_path / "pc.jsonl", rows)), batch_size=len(rows))
    batch = next(iter(dm.calibration_dataloader()))  # calibration falls back to train, in file order
    for i, row in enumerate(rows):
        p = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        c = tokenizer(row["completion"], add_special_tokens=False)["input_ids"]
        assert _real(batch, i) == p + c
        labels = batch["labels"][i][: len(p) + len(c)].tolist()
        for k, (token, label) in enumerate(zip(p + c, labels)):
            assert label == (-100 if k < len(p) else token), (i, k)
        assert tokenizer.decode(p + c) == row["prompt"] + row["completion"]

    unmasked = TextJsonlDataModule(tokenizer, train=str(tmp_path / "pc.jsonl"), batch_size=len(rows),
                                   mask_prompt=False, add_eos=True)
    batch = next(iter(unmasked.calibration_dataloader()))
    for i in range(len(rows)):
        ids = _real(batch, i)
        assert ids[-1] == tokenizer.eos_token_id
        assert batch["labels"][i][: len(ids)].tolist() == [-100] + ids[1:]


def test_messages_labels_are_the_assistant_turns(tmp_path, tokenizer) -> None:
    rows = [r for r in ROWS if "messages" in r]
    dm = TextJsonlDataModule(tokenizer, val=str(_write(tmp_path / "m.jsonl", rows)), batch_size=len(rows))
    batch = next(iter(dm.val_dataloader()))
    for i, row in enumerate(rows):
        ids = _real(batch, i)
        text = tokenizer.apply_chat_template(row["messages"], tokenize=False)
        assert tokenizer.decode(ids) == text
        labels = batch["labels"][i][: len(ids)].tolist()
        # the labelled runs, decoded, are exactly each assistant reply and its end-of-turn marker
        runs, current = [], []
        for token, label in zip(ids, labels):
            if label != -100:
                assert label == token
                current.append(token)
            elif current:
                runs.append(current)
                current = []
        runs += [current] if current else []
        replies = [m["content"] + "<|im_end|>\n" for m in row["messages"] if m["role"] == "assistant"]
        assert [tokenizer.decode(r) for r in runs] == replies


def test_tokenizer_special_affixes_go_around_text_rows(tmp_path) -> None:
    from tokenizers.processors import TemplateProcessing

    tok = train_bpe_tokenizer(_corpus(), 400)  # a Llama-style tokenizer: BOS ... EOS around every text
    bos, eos = tok.bos_token_id, tok.eos_token_id
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|bos|> $A <|endoftext|>", special_tokens=[("<|bos|>", bos), ("<|endoftext|>", eos)])
    rows = [{"prompt": "Say", "completion": " hi"}, ROWS[2]]
    dm = TextJsonlDataModule(tok, train=str(_write(tmp_path / "a.jsonl", rows)), batch_size=2, add_eos=True)
    batch = next(iter(dm.calibration_dataloader()))
    p, c = (tok(t, add_special_tokens=False)["input_ids"] for t in ("Say", " hi"))
    assert _real(batch, 0) == [bos, *p, *c, eos]  # add_eos does not double the tokenizer's own EOS
    assert batch["labels"][0][: len(p) + len(c) + 2].tolist() == [-100] * (1 + len(p)) + c + [eos]
    # chat rows take their special tokens from the template only
    assert _real(batch, 1)[0] != bos and tok.decode(_real(batch, 1)) == tok.apply_chat_template(
        ROWS[2]["messages"], tokenize=False)


def test_max_length_num_samples_and_padding_multiple(tmp_path, tokenizer) -> None:
    dm = TextJsonlDataModule(tokenizer, calibration=str(TEXT_JSONL), max_length=5, num_samples=3, batch_size=8,
                             pad_to_multiple_of=8)
    batches = _all_batches(dm.calibration_dataloader())
    assert len(batches) == 1 and batches[0]["input_ids"].shape == (3, 8)
    assert batches[0]["attention_mask"].sum(1).tolist() == [5, 5, 5]


def test_calibration_order_is_file_order_and_train_shuffle_is_seeded(tmp_path, tokenizer) -> None:
    path = _write(tmp_path / "n.jsonl", [{"text": f"row {i}"} for i in range(24)])

    def order(loader):
        return [tokenizer.decode(_real(b, i)) for b in loader for i in range(len(b["input_ids"]))]

    dm = TextJsonlDataModule(tokenizer, calibration=str(path), train=str(path), batch_size=5, seed=1)
    first, second = order(dm.calibration_dataloader()), order(dm.calibration_dataloader())
    assert first == second == [f"row {i}" for i in range(24)]
    again = TextJsonlDataModule(tokenizer, calibration=str(path), train=str(path), batch_size=5, seed=1)
    assert order(again.calibration_dataloader()) == first
    shuffled = order(dm.train_dataloader())
    assert shuffled != first and sorted(shuffled) == sorted(first)
    assert order(again.train_dataloader()) == shuffled
    other = TextJsonlDataModule(tokenizer, train=str(path), batch_size=5, seed=2)
    assert order(other.train_dataloader()) != shuffled


@pytest.mark.parametrize("lines, error, match", [
    (['{"text": "ok"}', '{"text": "broken"'], JsonlRowError, r"bad\.jsonl:2: not valid JSON"),
    (['{"prompt": "only a prompt"}'], JsonlRowError, r"bad\.jsonl:1: missing key 'completion'"),
    (['{"txt": "typo"}'], JsonlRowError, r"bad\.jsonl:1: missing key.*'txt'"),
    (['{"text": 3}'], JsonlRowError, r"bad\.jsonl:1: 'text' must be a string"),
    (['[1, 2]'], JsonlRowError, r"bad\.jsonl:1: expected a JSON object"),
    (['{"messages": [{"role": "user"}]}'], JsonlRowError, r"bad\.jsonl:1: messages\[0\] is missing key 'content'"),
    (['{"image": "a.png", "messages": [{"role": "user", "content": "x"}]}'], JsonlRowError,
     r"bad\.jsonl:1: has an image.*ImageTextJsonlDataModule"),
    ([], ValueError, r"bad\.jsonl' is empty"),
    (["", "  "], ValueError, r"bad\.jsonl' is empty"),
])
def test_text_errors_name_the_file_and_line(tmp_path, tokenizer, lines, error, match) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines))
    dm = TextJsonlDataModule(tokenizer, calibration=str(path))
    with pytest.raises(error, match=match):
        dm.setup("calibrate")


def test_missing_files_and_directories_are_errors(tmp_path, tokenizer) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        TextJsonlDataModule(tokenizer, train=str(tmp_path / "nowhere.jsonl"))
    with pytest.raises(FileNotFoundError, match="no-such-tokenizer"):
        TextJsonlDataModule(str(tmp_path / "no-such-tokenizer"), train=str(TEXT_JSONL))
    with pytest.raises(FileNotFoundError, match="no-such-processor"):
        ImageTextJsonlDataModule(str(tmp_path / "no-such-processor"), train=str(TEXT_JSONL))
    with pytest.raises(ValueError, match="padding_side"):
        TextJsonlDataModule(tokenizer, train=str(TEXT_JSONL), padding_side="middle")


def test_messages_without_a_chat_template_is_an_error(tmp_path, tokenizer) -> None:
    plain = train_bpe_tokenizer(_corpus(), 300, chat_template=None)
    dm = TextJsonlDataModule(plain, train=str(TEXT_JSONL))
    with pytest.raises(JsonlRowError, match=r"text\.jsonl:3: a 'messages' row needs a chat template"):
        dm.setup("fit")


def test_progress_bar_while_tokenising(tmp_path, tokenizer, capsys) -> None:
    dm = TextJsonlDataModule(tokenizer, train=str(TEXT_JSONL), progress=True)
    dm.setup("fit")
    assert "tokenising train" in capsys.readouterr().err


# -- image + text ------------------------------------------------------------------------------------

PATCH, MERGE, MIN_PIXELS, MAX_PIXELS = 4, 2, 8 * 8, 32 * 32


def _image_tokens(height: int, width: int) -> int:
    """Tokens of a (height, width) image for the tiny processor, from Qwen's resize rule (sides multiples of 8)."""
    factor = PATCH * MERGE
    h, w = height, width
    if h * w > MAX_PIXELS:  # scale down to fit, floor to the factor
        beta = math.sqrt(h * w / MAX_PIXELS)
        h, w = math.floor(h / beta / factor) * factor, math.floor(w / beta / factor) * factor
    return (h // factor) * (w // factor)


@pytest.fixture(scope="module")
def processor_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("proc")
    tiny_qwen3_vl_processor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS).save_pretrained(path)
    return path


@pytest.fixture()
def image_rows(tmp_path) -> tuple[Path, list[dict], list[int]]:
    from PIL import Image

    (tmp_path / "img").mkdir()
    sizes = {"wide.png": (16, 32), "tall.png": (24, 16), "big.png": (64, 64)}
    for i, (name, (h, w)) in enumerate(sizes.items()):
        pixels = torch.randint(0, 256, (h, w, 3), generator=torch.Generator().manual_seed(i), dtype=torch.uint8)
        Image.fromarray(pixels.numpy()).save(tmp_path / "img" / name)
    rows = [
        {"image": "img/wide.png", "messages": [{"role": "user", "content": "What is in the image?"},
                                                {"role": "assistant", "content": "A red square."}]},
        {"text": "Hello, world!"},
        {"images": ["img/tall.png", str(tmp_path / "img" / "big.png")],
         "messages": [{"role": "user", "content": "Compare <image> with <image>."},
                      {"role": "assistant", "content": "The second is bigger."}]},
        {"messages": [{"role": "user", "content": "No image here?"}, {"role": "assistant", "content": "No."}]},
    ]
    expected = [_image_tokens(16, 32), 0, _image_tokens(24, 16) + _image_tokens(64, 64), 0]
    return _write(tmp_path / "mm.jsonl", rows), rows, expected


def test_tiny_processor_matches_the_tiny_config(processor_dir) -> None:
    from transformers import AutoProcessor

    from lightprune.testing.tiny import tiny_config

    config = tiny_config("qwen3_vl_moe")
    processor = AutoProcessor.from_pretrained(str(processor_dir), local_files_only=True)
    tok = processor.tokenizer
    assert processor.image_token_id == config.image_token_id == 120
    assert processor.video_token_id == config.video_token_id
    assert processor.vision_start_token_id == config.vision_start_token_id
    assert processor.vision_end_token_id == config.vision_end_token_id
    assert len(tok) <= config.text_config.vocab_size
    ip = processor.image_processor
    assert (ip.patch_size, ip.merge_size, ip.temporal_patch_size) == (4, 2, 2)
    with pytest.raises(ValueError, match="vision token ids"):
        tiny_qwen3_vl_processor(train_bpe_tokenizer(["abc"], 128, image_tokens=True))


def test_image_text_batches_run_through_the_tiny_model(processor_dir, image_rows, tiny) -> None:
    path, rows, expected = image_rows
    dm = ImageTextJsonlDataModule(str(processor_dir), calibration=str(path), batch_size=2)
    model = tiny("qwen3_vl_moe")
    tok = dm.processor.tokenizer
    seen = 0
    for batch in dm.calibration_dataloader():
        n = len(batch["input_ids"])
        counts = (batch["input_ids"] == 120).sum(1).tolist()
        assert counts == expected[seen:seen + n]
        if sum(counts):
            grid = batch["image_grid_thw"]
            assert int((grid.prod(-1) // MERGE ** 2).sum()) == sum(counts)
            assert batch["pixel_values"].shape[0] == int(grid.prod(-1).sum())
            assert (batch["mm_token_type_ids"] == (batch["input_ids"] == 120).long()).all()
        else:
            assert "pixel_values" not in batch
        for i in range(n):
            ids, labels = _real(batch, i), batch["labels"][i][batch["attention_mask"][i].bool()].tolist()
            row = rows[seen + i]
            assert 120 not in labels  # image tokens never carry labels
            label_text = tok.decode([lab for lab in labels if lab != -100])
            if "messages" in row:
                assert label_text == row["messages"][-1]["content"] + "<|im_end|>\n"
                images = len(row.get("images", [])) + ("image" in row)
                assert ids.count(122) == ids.count(123) == images
            else:
                assert tok.decode(ids) == row["text"]
        with torch.no_grad():
            out = model(**batch)
        assert out.logits.shape == (*batch["input_ids"].shape, 128) and torch.isfinite(out.loss)
        seen += n
    assert seen == len(rows)


def test_image_placeholder_positions_and_padding_side_agree(processor_dir, image_rows, tiny) -> None:
    path, rows, _ = image_rows
    model = tiny("qwen3_vl_moe")
    losses = []
    for side in ("right", "left"):
        dm = ImageTextJsonlDataModule(str(processor_dir), calibration=str(path), batch_size=4, padding_side=side)
        batch = next(iter(dm.calibration_dataloader()))
        text = dm.processor.tokenizer.decode(_real(batch, 2))
        # the two images stand where their placeholders were, in order, expanded to their sizes
        tall, big = "<|image_pad|>" * _image_tokens(24, 16), "<|image_pad|>" * _image_tokens(64, 64)
        assert f"Compare <|vision_start|>{tall}<|vision_end|> with <|vision_start|>{big}<|vision_end|>." in text
        with torch.no_grad():
            losses.append(model(**batch).loss)
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)


def test_image_parts_without_placeholders_and_workers(tmp_path, processor_dir, image_rows) -> None:
    path, rows, expected = image_rows
    parts = {"image": "img/wide.png", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": "A square."}]}
    mixed = _write(path.parent / "parts.jsonl", [parts, rows[1]])
    dm = ImageTextJsonlDataModule(str(processor_dir), calibration=str(mixed), batch_size=2, num_workers=1)
    batch = next(iter(dm.calibration_dataloader()))
    text = dm.processor.tokenizer.decode(_real(batch, 0))
    pads = "<|image_pad|>" * expected[0]
    assert f"<|im_start|>user\n<|vision_start|>{pads}<|vision_end|>What is it?<|im_end|>" in text
    assert batch["image_grid_thw"].tolist() == [[1, 4, 8]]


def test_image_errors(tmp_path, processor_dir, image_rows) -> None:
    path, rows, _ = image_rows
    missing = _write(tmp_path / "missing.jsonl", [rows[0], {**rows[0], "image": "img/nope.png"}])
    dm = ImageTextJsonlDataModule(str(processor_dir), train=str(missing))
    with pytest.raises(FileNotFoundError, match=r"missing\.jsonl:2: image 'img/nope\.png' not found"):
        dm.setup("fit")
    slots = _write(tmp_path / "slots.jsonl", [{**rows[2], "images": ["img/tall.png"]}])
    with pytest.raises(JsonlRowError, match=r"slots\.jsonl:1: 1 image\(s\) but 2 image slot"):
        ImageTextJsonlDataModule(str(processor_dir), train=str(slots)).setup("fit")
    short = ImageTextJsonlDataModule(str(processor_dir), calibration=str(path), max_length=12, batch_size=1)
    with pytest.raises(ValueError, match=r"mm\.jsonl:1: image tokens reach position .* max_length=12"):
        next(iter(short.calibration_dataloader()))


def test_calibrate_and_fit_on_image_text_with_the_trainer(tmp_path, processor_dir, image_rows) -> None:
    from lightprune.cli.trainer import PruneTrainer
    from lightprune.finetune.causal_lm import MoECausalLM

    path, rows, _ = image_rows
    dm = ImageTextJsonlDataModule(str(processor_dir), train=str(path), val=str(path), batch_size=2)
    kw = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, default_root_dir=str(tmp_path), max_steps=1, limit_val_batches=1)
    module = MoECausalLM(tiny="qwen3_vl_moe")
    PruneTrainer(**kw).calibrate(module, datamodule=dm)
    trainer = PruneTrainer(**kw)
    trainer.fit(module, datamodule=dm)
    assert torch.isfinite(trainer.callback_metrics["train/loss"])

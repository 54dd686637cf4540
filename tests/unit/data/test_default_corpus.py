"""The embedded default corpus: deterministic, split by topic, cached, learnable, and self-checking."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from lightprune.data import (
    DefaultCorpusDataModule,
    DefaultCorpusError,
    build_default_corpus,
    default_corpus_dir,
    default_model_overrides,
    load_default_corpus,
)
from lightprune.data.pydoc_rows import SPLIT_SHARES, corpus_splits, parse_topic, python_topics, topic_blocks

VOCAB = 512
SPLITS = tuple(SPLIT_SHARES)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _trainer(root: Path):
    import lightning.pytorch as pl

    return pl.Trainer(accelerator="cpu", devices=1, max_steps=2, limit_val_batches=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=str(root))


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lp_cache")
    build_default_corpus(root, vocab_size=VOCAB)
    return root


@pytest.fixture(scope="module")
def dm(cache) -> DefaultCorpusDataModule:
    module = DefaultCorpusDataModule(vocab_size=VOCAB, max_length=64, batch_size=4, cache_dir=str(cache))
    module.prepare_data()
    module.setup()
    return module


def test_two_builds_give_identical_files(cache, tmp_path) -> None:
    other = build_default_corpus(tmp_path, vocab_size=VOCAB)
    first = _files(default_corpus_dir(cache))
    assert _files(other.root) == first
    assert {"train.jsonl", "val.jsonl", "calibration.jsonl", "test.jsonl", "manifest.json",
            f"tokenizer-{VOCAB}/tokenizer.json", f"tokenizer-{VOCAB}/manifest.json"} <= set(first)
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name or ".stale-" in p.name]


def test_splits_are_disjoint_by_topic_and_by_text(cache) -> None:
    corpus = load_default_corpus(cache, vocab_size=VOCAB)
    rows = {split: _rows(corpus.files[split]) for split in SPLITS}
    topics = {split: {r["topic"] for r in rs} for split, rs in rows.items()}
    for i, a in enumerate(SPLITS):
        assert rows[a] and topics[a], a
        for b in SPLITS[i + 1:]:
            assert not topics[a] & topics[b], (a, b)
    assert corpus.manifest["topics"] == {s: sorted(t) for s, t in topics.items()}
    assert corpus.manifest["rows"] == {s: len(r) for s, r in rows.items()}
    # shared paragraphs (``if`` is a section of ``compound``) are kept in one topic only
    paragraphs = {split: {p for r in rs for p in (r.get("text") or r["completion"]).split("\n\n") if len(p) > 80}
                  for split, rs in rows.items()}
    for i, a in enumerate(SPLITS):
        for b in SPLITS[i + 1:]:
            assert not paragraphs[a] & paragraphs[b], (a, b)
    # every row is one of the documented shapes; train is the largest split by far
    kinds = {r["kind"] for rs in rows.values() for r in rs}
    assert kinds == {"topic", "section", "api", "grammar", "text"}
    chars = {s: sum(len(r.get("text", "")) + len(r.get("completion", "")) for r in rs) for s, rs in rows.items()}
    assert chars["train"] > 0.6 * sum(chars.values())
    assert corpus_splits() == rows  # the files are the in-memory rows, in order


def test_rows_are_clean_and_instructions_answer_from_their_topic() -> None:
    topics = python_topics()
    blocks = topic_blocks(topics)
    assert [b.text for b in parse_topic(topics["while"])][:1] == ['The "while" statement']
    # "while" is a section of "compound": the shorter topic keeps the shared paragraphs
    while_text = {b.text for b in blocks["while"] if b.kind != "heading"}
    assert while_text and while_text <= {b.text for b in parse_topic(topics["compound"])}
    assert not while_text & {b.text for b in blocks["compound"]}
    # "if" and "else" are the same text: the first name keeps it, and "if" has no rows
    assert not blocks["if"] and blocks["else"]
    rows = [r for rs in corpus_splits().values() for r in rs]
    for r in rows:
        for value in (r.get("text"), r.get("prompt"), r.get("completion")):
            if value is not None:
                assert value.strip() and "\u2019" not in value and "-[ Footnotes ]-" not in value
                assert not re.search(r"^([*=~-])\1{2,}$", value, re.MULTILINE), value
    explain = next(r for r in rows if r.get("prompt") == "Explain the Python topic 'while':\n")
    assert explain["completion"].startswith('The "while" statement is used for repeated execution')
    api = next(r for r in rows if r["kind"] == "api" and "str.split(" in r["prompt"])
    assert api["completion"].startswith("Return a list of the words in the string")


def test_cache_is_reused_not_rewritten(cache, dm) -> None:
    root = default_corpus_dir(cache)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    again = DefaultCorpusDataModule(vocab_size=VOCAB, cache_dir=str(cache))
    again.prepare_data()
    again.setup("fit")
    assert again.vocab_size_needed == dm.vocab_size_needed
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before


def test_cache_root_from_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LIGHTPRUNE_CACHE", str(tmp_path))
    assert default_corpus_dir().parent == tmp_path / "default_corpus"
    assert default_corpus_dir(tmp_path / "x").parent == tmp_path / "x" / "default_corpus"


def test_tokenizer_round_trips_corpus_text(dm) -> None:
    tok = dm.tokenizer
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 1, 2)
    assert len(tok) == dm.vocab_size_needed <= VOCAB
    texts = [r.get("text") or r["prompt"] + r["completion"] for split in ("train", "test")
             for r in _rows(dm.corpus.files[split])[:40]]
    texts = [t for t in texts if t.isascii()]
    assert len(texts) > 60
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) == text


def test_batches_mask_prompts_and_end_with_eos(dm) -> None:
    rows = _rows(dm.corpus.files["train"])
    i = next(k for k, r in enumerate(rows) if "prompt" in r)
    sample = dm.dataset("train")[i]
    prompt = dm.tokenizer(rows[i]["prompt"], add_special_tokens=False)["input_ids"]
    assert sample["input_ids"][:len(prompt)].tolist() == prompt[:64]
    assert (sample["labels"][:len(prompt)] == -100).all()
    assert (sample["labels"][len(prompt):] != -100).all()
    full = DefaultCorpusDataModule(vocab_size=VOCAB, max_length=None, cache_dir=str(dm.hparams.cache_dir))
    assert full.dataset("train")[i]["input_ids"][-1].item() == dm.tokenizer.eos_token_id
    for split, loader in [("train", dm.train_dataloader()), ("val", dm.val_dataloader()),
                          ("test", dm.test_dataloader()), ("calibration", dm.calibration_dataloader())]:
        batch = next(iter(loader))
        assert batch["input_ids"].shape[0] == 4 and batch["input_ids"].shape[1] <= 64, split
        assert batch["input_ids"].max() < dm.vocab_size_needed


def test_batches_train_a_tiny_moe_model(dm) -> None:
    from lightprune.testing.tiny import tiny_model

    overrides = default_model_overrides(dm)
    assert overrides == dm.model_overrides
    assert overrides["vocab_size"] == dm.vocab_size_needed and overrides["pad_token_id"] == 0
    model = tiny_model("qwen3_moe", **overrides).train()
    assert model.config.vocab_size == len(dm.tokenizer)
    batch = next(iter(dm.train_dataloader()))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):  # the same batch again and again: the loss must fall
        loss = model(**batch).loss
        assert torch.isfinite(loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(len(dm.tokenizer)), rel=0.2)
    assert losses[-1] < 0.85 * losses[0] and losses[-1] < min(losses[:4])


def test_a_truncated_file_is_reported_by_setup_and_rebuilt_by_prepare_data(tmp_path) -> None:
    corpus = build_default_corpus(tmp_path, vocab_size=VOCAB)
    good = _files(corpus.root)
    train = corpus.files["train"]
    train.write_bytes(train.read_bytes()[: train.stat().st_size // 2])  # cut mid-line
    with pytest.raises(DefaultCorpusError, match=r"train\.jsonl is corrupt.*build_default_corpus"):
        load_default_corpus(tmp_path, vocab_size=VOCAB)
    module = DefaultCorpusDataModule(vocab_size=VOCAB, cache_dir=str(tmp_path))
    module.trainer = _trainer(tmp_path)  # under a Trainer, setup only reads
    with pytest.raises(DefaultCorpusError, match=r"train\.jsonl is corrupt"):
        module.setup("fit")
    with pytest.warns(UserWarning, match=r"rebuilding the default corpus cache: .*train\.jsonl is corrupt"):
        module.prepare_data()
    assert _files(corpus.root) == good
    module.setup("fit")
    assert len(module.dataset("train")) == corpus.manifest["rows"]["train"]


def test_a_corrupt_tokenizer_or_manifest_is_rebuilt(tmp_path) -> None:
    corpus = build_default_corpus(tmp_path, vocab_size=VOCAB)
    good = _files(corpus.root)
    (corpus.tokenizer_dir / "tokenizer.json").write_text("{")
    with pytest.raises(DefaultCorpusError, match=r"tokenizer\.json is corrupt"):
        load_default_corpus(tmp_path, vocab_size=VOCAB)
    with pytest.warns(UserWarning, match="rebuilding the default corpus tokenizer"):
        build_default_corpus(tmp_path, vocab_size=VOCAB)
    assert _files(corpus.root) == good
    (corpus.root / "manifest.json").write_text("not json")
    with pytest.raises(DefaultCorpusError, match=r"manifest\.json is corrupt"):
        load_default_corpus(tmp_path, vocab_size=VOCAB)
    with pytest.warns(UserWarning, match="rebuilding the default corpus cache"):
        build_default_corpus(tmp_path, vocab_size=VOCAB)
    assert _files(corpus.root) == good
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name or ".stale-" in p.name]


def test_setup_reads_under_a_trainer_and_prepares_without_one(tmp_path) -> None:
    module = DefaultCorpusDataModule(vocab_size=VOCAB, cache_dir=str(tmp_path))
    module.trainer = _trainer(tmp_path)
    with pytest.raises(DefaultCorpusError, match="manifest.json is missing.*prepare_data"):
        module.setup("fit")
    assert not (tmp_path / "default_corpus").exists() or not any((tmp_path / "default_corpus").iterdir())
    # without a Trainer nothing calls prepare_data (PruneTrainer.calibrate, a notebook): setup prepares
    alone = DefaultCorpusDataModule(vocab_size=VOCAB, batch_size=2, cache_dir=str(tmp_path))
    alone.setup("calibrate")
    assert next(iter(alone.calibration_dataloader()))["input_ids"].shape[0] == 2
    module.setup("fit")
    assert len(module.dataset("train")) == len(alone.dataset("train"))


@pytest.mark.parametrize("kwargs, match", [({"vocab_size": 10}, "vocab_size must be an int >= 64"),
                                           ({"max_length": 0}, "max_length must be an int >= 1 or None"),
                                           ({"batch_size": 0}, "batch_size must be an int >= 1, got 0"),
                                           ({"num_samples": 0}, "num_samples"),
                                           ({"padding_side": "up"}, "padding_side")])
def test_constructor_validates_arguments(kwargs, match, tmp_path) -> None:
    with pytest.raises(ValueError, match=match):
        DefaultCorpusDataModule(cache_dir=str(tmp_path), **kwargs)


def test_fit_with_the_trainer_prepares_and_reads_the_cache(tmp_path) -> None:
    from lightprune.finetune.causal_lm import MoECausalLM

    module = DefaultCorpusDataModule(vocab_size=VOCAB, max_length=32, batch_size=2, num_samples=8,
                                     cache_dir=str(tmp_path))
    assert not (tmp_path / "default_corpus").exists()  # construction writes nothing
    trainer = _trainer(tmp_path)
    overrides = {"vocab_size": 600, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
    trainer.fit(MoECausalLM(tiny="qwen3_moe", tiny_overrides=overrides), datamodule=module)
    assert trainer.global_step == 2
    assert load_default_corpus(tmp_path, vocab_size=VOCAB).manifest["rows"]["train"] > 500

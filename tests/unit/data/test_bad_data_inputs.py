"""Broken tokenizers and rows are one clear error naming the file, never a bare library exception."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from fixtures import FIXTURES

from lightprune.data import JsonlRowError, TextJsonlDataModule, train_bpe_tokenizer
from lightprune.data.rows import read_jsonl

TEXT = FIXTURES / "data" / "text.jsonl"


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok")
    rows = [json.loads(line) for line in TEXT.read_text().splitlines()]
    train_bpe_tokenizer([r.get("text") or r.get("prompt", "") for r in rows] * 4, 300).save_pretrained(path)
    return path


def test_a_tokenizer_directory_without_tokenizer_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=rf"tokenizer directory '{tmp_path}' has no tokenizer files "
                                                r"\(none of tokenizer.json, tokenizer_config.json"):
        TextJsonlDataModule(str(tmp_path), calibration=str(TEXT))


def test_a_corrupt_tokenizer_json_names_the_file(tok_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tok_dir.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    data = (broken / "tokenizer.json").read_bytes()
    (broken / "tokenizer.json").write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(ValueError, match=rf"'{broken / 'tokenizer.json'}' is not valid JSON .*damaged"):
        TextJsonlDataModule(str(broken), calibration=str(TEXT))


def test_a_lone_surrogate_in_a_row_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "fine"}\n{"prompt": "a \\ud800 b", "completion": "c"}\n')
    with pytest.raises(JsonlRowError, match=re.escape(f"{path}:2: 'prompt' holds " + "\\" + "ud800, a lone surrogate")):
        read_jsonl(path)


def test_a_tokenizer_larger_than_the_model_s_vocabulary(tok_dir: Path) -> None:
    from lightprune.finetune import MoECausalLM

    module = MoECausalLM(tiny="qwen3_moe", tiny_overrides={"num_hidden_layers": 2, "vocab_size": 64})
    module.configure_model()
    dm = TextJsonlDataModule(str(tok_dir), calibration=str(TEXT), batch_size=4)
    dm.setup("calibrate")
    batch = next(iter(dm.calibration_dataloader()))
    top = int(batch["input_ids"].max())
    assert top >= 64  # the tokenizer's ids reach past the model's 64 embeddings
    with pytest.raises(ValueError, match=rf"the data has token id {top}, but the model's embedding has 64 rows"):
        with torch.no_grad():
            module(**batch)


def test_a_hub_id_is_not_a_local_checkpoint() -> None:
    from lightprune.finetune import MoECausalLM

    with pytest.raises(FileNotFoundError, match="'Org/Model-7B' does not exist \\(it looks like a hub id: lightprune "
                                                "loads local directories only"):
        MoECausalLM(checkpoint="Org/Model-7B")

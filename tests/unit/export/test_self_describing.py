"""Every expert-pruning export is self-describing: tokenizer, model card, manifest provenance, modes, no foreign code.

One test per promise of ``save_pruned`` / ``export_pruned``: the tokenizer files of the source (or the given
processor) travel with the checkpoint and tokenize the same; ``README.md`` lists the plan's original expert
ids per layer and the sizes; the manifest holds ``plan.to_dict()`` and the source's safetensors header
fingerprint; file modes follow the umask; a foreign ``auto_map`` is dropped; exporting into (or over) the
source checkpoint is refused before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
import torch

import lightprune as lp
from lightprune.export import CARD_FILE, MANIFEST_FILE, model_card
from lightprune.testing.tiny import tiny_model

SENTENCE = "the tiny model reads a tiny sentence"
TEXTS = [SENTENCE, "hello world, the pruned experts say hello", "a b c d e f g"] * 4
FOREIGN = {"AutoConfig": "configuration_foo.FooConfig", "AutoModelForCausalLM": "modeling_foo.FooForCausalLM"}


def plan_of(model, ids: list[list[int]]) -> lp.ExpertPlan:
    layers = lp.find_moe_layers(model)
    return lp.ExpertPlan(keep={layer.index: ids[i] for i, layer in enumerate(layers)},
                         num_experts={layer.index: layer.num_experts for layer in layers},
                         criterion="test", ratio=0.5, allocation="uniform")


UNIFORM = [[1, 3, 4, 6], [0, 2, 5, 7], [4, 5, 6, 7]]
NON_UNIFORM = [[1, 3], [0, 2, 5, 7], [0, 1, 2, 3, 4, 5, 6, 7]]


def tokenizer():
    from lightprune.data import train_bpe_tokenizer

    return train_bpe_tokenizer(TEXTS, vocab_size=128)


def source_checkpoint(path: Path, **save_kwargs) -> Path:
    tiny_model("qwen3_moe", seed=1).save_pretrained(path, **save_kwargs)
    tokenizer().save_pretrained(path)
    return path


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def manifest(out: Path) -> dict:
    return json.loads((Path(out) / MANIFEST_FILE).read_text())


def test_tokenizer_of_the_source_travels_and_tokenizes_the_same(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = source_checkpoint(tmp_path / "src")
    for junk in ("modeling_foo.py", "notes.txt", "extra.bin"):
        (src / junk).write_text("not for the export")
    model = AutoModelForCausalLM.from_pretrained(src)  # config._name_or_path is the source directory
    out = lp.export_pruned(model, plan_of(model, UNIFORM), tmp_path / "out").path

    copied = ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [*copied, "config.json", "generation_config.json", "model.safetensors", MANIFEST_FILE, CARD_FILE])
    assert all((out / name).read_bytes() == (src / name).read_bytes() for name in copied)
    assert manifest(out)["tokenizer"] == {"origin": "source_dir", "files": copied}
    ids = AutoTokenizer.from_pretrained(src)(SENTENCE)["input_ids"]
    exported = AutoTokenizer.from_pretrained(out)
    assert exported(SENTENCE)["input_ids"] == ids and len(ids) > 2
    batch = exported(SENTENCE, return_tensors="pt")
    generated = lp.load_pruned(out).generate(**batch, max_new_tokens=4, min_new_tokens=4, do_sample=False,
                                             pad_token_id=exported.pad_token_id)
    assert generated.shape == (1, len(ids) + 4) and generated[0, :len(ids)].tolist() == ids


def test_tokenizer_from_a_processor_or_none_at_all(tmp_path):
    model = tiny_model("qwen3_moe")  # built in memory: no source directory
    lp.prune_experts(model, plan_of(model, UNIFORM))
    with_tok = lp.save_pruned(model, tmp_path / "with", processor=tokenizer()).path
    assert manifest(with_tok)["tokenizer"] == {"origin": "processor", "class": "TokenizersBackend",
                                               "files": ["chat_template.jinja", "tokenizer.json",
                                                         "tokenizer_config.json"]}
    without = lp.save_pruned(model, tmp_path / "without").path
    assert manifest(without)["tokenizer"] is None
    assert sorted(p.name for p in without.iterdir()) == sorted(
        ["config.json", "generation_config.json", "model.safetensors", MANIFEST_FILE, CARD_FILE])


def kept_table(card: str) -> dict[int, tuple[int, str, str]]:
    """{layer: (kept, of, original expert ids)} from the card's kept-experts table."""
    section = card.split("## Kept experts\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("| ").split(" | ") for line in section.splitlines() if line.startswith("| ")][1:]
    return {int(layer): (int(kept), of, ids) for layer, kept, of, ids in rows}


def test_model_card_lists_the_plans_original_ids_sizes_and_facts(tmp_path, monkeypatch):
    model = tiny_model("qwen3_moe")
    before = sum(p.numel() for p in model.parameters())
    plan = plan_of(model, UNIFORM)
    evaluation = {"wikitext": {"ppl": 12.5}, "mmlu": 0.25}
    out = lp.export_pruned(model, plan, tmp_path / "out",
                           card={"command": "lightprune export --x 1", "evaluation": evaluation,
                                 "source": "org/tiny-moe"}).path
    card, facts = (out / CARD_FILE).read_text(), manifest(out)
    assert card == model_card(facts)
    assert kept_table(card) == {layer: (4, "8", ", ".join(map(str, ids))) for layer, ids in plan.keep.items()}
    after = sum(p.numel() for p in model.parameters())
    for line in ["- checkpoint: `org/tiny-moe`", "- criterion: `test`", "- ratio: 0.5", "- allocation: `uniform`",
                 "- routed experts: 24 -> 12", f"| parameters | {before:,} | {after:,} |",
                 f"| safetensors bytes on disk | unknown | {(out / 'model.safetensors').stat().st_size:,} |",
                 "| wikitext.ppl | 12.5 |", "| mmlu | 0.25 |", f"Written by lightprune {lp.__version__} with:",
                 "```bash\nlightprune export --x 1\n```"]:
        assert line in card, line
    assert facts["evaluation"] == evaluation and facts["command"] == "lightprune export --x 1"

    # save_pruned without a plan: a card with what it knows, the command from sys.argv
    monkeypatch.setattr(sys, "argv", ["prune.py", "--ratio", "0.5"])
    plain = (lp.save_pruned(model, tmp_path / "plain").path / CARD_FILE).read_text()
    assert "Original expert ids are unknown: no plan was given." in plain
    assert kept_table(plain) == {layer: (4, "unknown", "unknown") for layer in plan.keep}
    assert "```bash\nprune.py --ratio 0.5\n```" in plain and "No evaluation was given." in plain


def header_sha(file: Path) -> str:
    data = file.read_bytes()
    return hashlib.sha256(data[:8 + int.from_bytes(data[:8], "little")]).hexdigest()


def test_manifest_records_the_plan_and_the_source_fingerprint(tmp_path):
    src = source_checkpoint(tmp_path / "src", max_shard_size="100KB")
    shards = sorted(src.glob("*.safetensors"))
    assert len(shards) > 1
    model = tiny_model("qwen3_moe", seed=1)
    plan = plan_of(model, UNIFORM)
    out = lp.export_pruned(model, plan, tmp_path / "out", source_dir=src).path
    facts = manifest(out)
    assert facts["plan"] == plan.to_dict()
    assert facts["source"] == str(src)
    assert facts["source_fingerprint"] == [{"name": f.name, "size": f.stat().st_size, "header_sha256": header_sha(f)}
                                           for f in shards]
    assert facts["weight_bytes_before"] == sum(f.stat().st_size for f in shards)
    assert facts["parameters_before"] == sum(p.numel() for p in tiny_model("qwen3_moe", seed=1).parameters())

    lp.prune_experts(model := tiny_model("qwen3_moe"), plan)  # no source: nulls, never guesses
    facts = manifest(lp.save_pruned(model, tmp_path / "bare"))
    assert [facts[k] for k in ("plan", "source", "source_fingerprint", "weight_bytes_before")] == [None] * 4


@pytest.mark.parametrize("umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_file_modes_follow_the_umask(tmp_path, umask, file_mode, dir_mode):
    old = os.umask(umask)
    try:
        model = tiny_model("qwen3_moe")
        out = lp.export_pruned(model, plan_of(model, UNIFORM), tmp_path / "out", processor=tokenizer()).path
    finally:
        os.umask(old)
    modes = {p.relative_to(out).as_posix(): p.stat().st_mode & 0o777 for p in out.rglob("*")}
    assert "model.safetensors" in modes and "tokenizer.json" in modes
    assert modes == {name: dir_mode if (out / name).is_dir() else file_mode for name in modes}
    assert out.stat().st_mode & 0o777 == dir_mode


def test_a_foreign_auto_map_is_not_exported(tmp_path):
    src = source_checkpoint(tmp_path / "src")
    config = json.loads((src / "tokenizer_config.json").read_text())
    (src / "tokenizer_config.json").write_text(json.dumps({**config, "auto_map": {"AutoTokenizer": ["tok_foo.T", None]}}))
    (src / "tok_foo.py").write_text("raise RuntimeError")
    for name, ids in [("uniform", UNIFORM), ("non_uniform", NON_UNIFORM)]:
        model = tiny_model("qwen3_moe")
        model.config.auto_map = dict(FOREIGN)
        out = lp.export_pruned(model, plan_of(model, ids), tmp_path / name, source_dir=src).path
        exported = json.loads((out / "config.json").read_text())
        if name == "uniform":
            assert "auto_map" not in exported and not (out / "modeling_lightprune.py").exists()
        else:
            assert exported["auto_map"] == {"AutoModelForCausalLM": "modeling_lightprune.Qwen3MoeForCausalLM"}
            assert (out / "modeling_lightprune.py").is_file()
        assert json.loads((out / "tokenizer_config.json").read_text()) == config
        assert not (out / "tok_foo.py").exists()


def test_exporting_into_the_source_is_refused_before_anything_is_written(tmp_path):
    from transformers import AutoModelForCausalLM

    src = source_checkpoint(tmp_path / "src")
    (tmp_path / "link").symlink_to(src)
    model = AutoModelForCausalLM.from_pretrained(src)
    before, listing = snapshot(src), sorted(os.listdir(tmp_path))
    plan = plan_of(model, UNIFORM)
    for out in (src, tmp_path, tmp_path / "link"):
        with pytest.raises(ValueError, match=rf"refusing to export into '{out.resolve()}'.*source checkpoint '{src}'"):
            lp.export_pruned(model, plan, out, overwrite=True)
        with pytest.raises(ValueError, match="refusing to export into"):
            lp.save_pruned(model, out, overwrite=True)
    other = tiny_model("qwen3_moe")  # an explicit source_dir is checked the same way
    with pytest.raises(ValueError, match=str(src)):
        lp.export_pruned(other, plan_of(other, UNIFORM), src, overwrite=True, source_dir=tmp_path / "link")
    assert snapshot(src) == before and sorted(os.listdir(tmp_path)) == listing
    assert {layer.num_experts for layer in lp.find_moe_layers(model)} == {8}  # no surgery either
    assert {layer.num_experts for layer in lp.find_moe_layers(other)} == {8}
    torch.testing.assert_close(model.lm_head.weight, AutoModelForCausalLM.from_pretrained(src).lm_head.weight)

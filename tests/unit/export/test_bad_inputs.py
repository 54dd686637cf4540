"""Bad inputs (issue 9): each gives ONE clear error naming the problem, and nothing is written half-way.

Each test feeds one bad input through the public API or the CLI and checks the exception type, that
its message names the offending value (path, key, layer, experts, ratio, ...), and that the output
directory was not created (or was left unchanged). The last two tests check that loading a
checkpoint never runs the checkpoint's own code unless ``trust_remote_code=True`` is passed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from fixtures import REPO

import lightprune as lp
from lightprune.testing.tiny import tiny_model

REPO = REPO
ENGLISH = "The quick brown fox jumps over the lazy dog. A tiny tokenizer for bad-input tests. " * 4


def _snapshot(root: Path) -> dict[str, bytes] | None:
    """{relative path: bytes} of every file under ``root``; None when ``root`` does not exist."""
    if not root.exists():
        return None
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def cli(monkeypatch):
    from lightprune.cli.app import cli_main

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", ["lightprune"])
    return cli_main


def _tiny_checkpoint(path: Path, family: str = "qwen3_moe", **overrides) -> Path:
    tiny_model(family, **overrides).save_pretrained(path)
    return path


def _single(err: BaseException) -> str:
    """The message of ``err``, checked to be the one error itself, not jsonargparse's Union wrapping."""
    message = str(err)
    assert "Union subtypes" not in message and "Expected a <class 'NoneType'>" not in message, message
    return message


def _safetensors(path: Path) -> Path:
    files = sorted(path.glob("*.safetensors"))
    assert len(files) == 1, files
    return files[0]


# -- wrong paths ------------------------------------------------------------------------------------

def test_wrong_checkpoint_path_cli(cli, tmp_path) -> None:
    run, missing = tmp_path / "run", tmp_path / "no_such_checkpoint"
    with pytest.raises(FileNotFoundError, match="no_such_checkpoint") as info:
        cli(["export", "--config", "configs/aimer.yaml", "--trainer.default_root_dir", str(run),
             "--model.init_args.checkpoint", str(missing)])
    assert "does not exist" in _single(info.value)
    assert not run.exists() and not missing.exists()


def test_wrong_checkpoint_path_load_pruned(tmp_path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=r"checkpoint directory .*nowhere.* does not exist"):
        lp.load_pruned(missing)
    assert not missing.exists()


def test_wrong_calibration_jsonl_path(tmp_path) -> None:
    from lightprune.data import TextJsonlDataModule, train_bpe_tokenizer

    tok = tmp_path / "tok"
    train_bpe_tokenizer([ENGLISH] * 8, 300).save_pretrained(tok)
    before = _snapshot(tmp_path)
    missing = tmp_path / "missing_calibration.jsonl"
    with pytest.raises(FileNotFoundError, match=r"calibration JSONL file .*missing_calibration.jsonl.* does not exist"):
        TextJsonlDataModule(str(tok), calibration=str(missing), batch_size=2)
    assert _snapshot(tmp_path) == before


# -- models the tool cannot prune -------------------------------------------------------------------

def test_dense_model_cli(cli, tmp_path) -> None:
    run = tmp_path / "run"
    with pytest.raises(ValueError, match="no MoE layers") as info:
        cli(["export", "--config", "configs/aimer_tiny.yaml", "--trainer.default_root_dir", str(run),
             "--model.init_args.tiny_overrides", json.dumps({"num_hidden_layers": 2, "mlp_only_layers": [0, 1]})])
    _single(info.value)
    assert not run.exists()


def test_dense_model_api() -> None:
    model = tiny_model("qwen3_moe", num_hidden_layers=2, mlp_only_layers=[0, 1])
    with pytest.raises(ValueError, match="no MoE layers: nothing to prune"):
        lp.score_weights(model, "aimer")


def test_unsupported_family_api(tmp_path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    ckpt = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(ckpt)
    before = _snapshot(ckpt)
    model = lp.load_pruned(ckpt)  # a plain loader: any uniform checkpoint loads, pruning is what refuses
    with pytest.raises(ValueError, match="unsupported model_type 'llama'") as info:
        lp.score_weights(model, "aimer")
    assert "qwen3_moe" in str(info.value)  # lists the supported types
    assert _snapshot(ckpt) == before


def test_unsupported_family_cli(cli, tmp_path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    ckpt, run = tmp_path / "llama", tmp_path / "run"
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(ckpt)
    with pytest.raises(ValueError, match="unsupported model_type 'llama'") as info:
        cli(["export", "--config", "configs/aimer.yaml", "--trainer.default_root_dir", str(run),
             "--model.init_args.checkpoint", str(ckpt)])
    assert "qwen3_moe" in _single(info.value)
    assert not run.exists()


# -- configuration ----------------------------------------------------------------------------------

def test_unknown_config_key(cli, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    text = (REPO / "configs" / "aimer_tiny.yaml").read_text()
    assert "allocation: uniform" in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("allocation: uniform", "alocation: uniform"))
    with pytest.raises(SystemExit) as info:
        cli(["export", "--config", str(bad), "--trainer.default_root_dir", str(run)])
    assert info.value.code == 2
    assert "alocation" in capsys.readouterr().err
    assert not run.exists()


# -- corrupt / truncated checkpoints ----------------------------------------------------------------

def test_truncated_checkpoint(tmp_path) -> None:
    ckpt = _tiny_checkpoint(tmp_path / "ckpt")
    weights = _safetensors(ckpt)
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    before = _snapshot(ckpt)
    with pytest.raises(ValueError, match=rf"{weights.name}.* is corrupt or truncated"):
        lp.load_pruned(ckpt)
    assert _snapshot(ckpt) == before


def test_corrupt_checkpoint(tmp_path) -> None:
    ckpt = _tiny_checkpoint(tmp_path / "ckpt")
    weights = _safetensors(ckpt)
    data = bytearray(weights.read_bytes())
    data[8:24] = b"\xff" * 16  # garble the JSON header
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"{weights.name}.* (corrupt|truncated)"):
        lp.load_pruned(ckpt)


def test_truncated_checkpoint_cli(cli, tmp_path) -> None:
    ckpt, run = _tiny_checkpoint(tmp_path / "ckpt"), tmp_path / "run"
    weights = _safetensors(ckpt)
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"{weights.name}.* is corrupt or truncated") as info:
        cli(["export", "--config", "configs/aimer.yaml", "--trainer.default_root_dir", str(run),
             "--model.init_args.checkpoint", str(ckpt)])
    _single(info.value)
    assert not run.exists()


# -- plans ------------------------------------------------------------------------------------------

def _plan_for_8(tmp_path: Path) -> Path:
    small = tiny_model("qwen3_moe", num_hidden_layers=2, num_experts=8)
    plan = lp.select_experts(lp.score_weights(small, "aimer"), 0.5, allocation="uniform")
    return plan.save(tmp_path / "plan8.json")


def test_plan_for_another_model_api(tmp_path) -> None:
    path = _plan_for_8(tmp_path)
    plan = lp.ExpertPlan.load(path)
    model = tiny_model("qwen3_moe", num_hidden_layers=2, num_experts=16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(lp.PlanError, match=r"plan was made for 8 experts in layer 0, .*16"):
        lp.prune_experts(model, plan)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(lp.PlanError, match=r"plan was made for 8 experts in layer 0"):
        with lp.mask_experts(model, plan):
            pass


def test_plan_for_another_model_export_callback(cli, tmp_path) -> None:
    path, run = _plan_for_8(tmp_path), tmp_path / "run"
    config = tmp_path / "from_plan.yaml"
    config.write_text(
        "model:\n  class_path: lightprune.finetune.MoECausalLM\n  init_args:\n    tiny: qwen3_moe\n"
        "    tiny_overrides: {num_hidden_layers: 2, num_experts: 16, num_experts_per_tok: 2}\n"
        "trainer:\n  accelerator: cpu\n  devices: 1\n  logger: false\n  enable_checkpointing: false\n"
        f"  callbacks:\n    - class_path: lightprune.callbacks.Export\n      init_args:\n"
        f"        plan_path: {str(path)!r}\n        overwrite: true\n")
    with pytest.raises(lp.PlanError, match=r"plan was made for 8 experts in layer 0, .*16"):
        cli(["export", "--config", str(config), "--trainer.default_root_dir", str(run)])
    assert not run.exists()


# -- statistics -------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_statistics(bad: float) -> None:
    scores = lp.score_weights(tiny_model("qwen3_moe", num_hidden_layers=2), "aimer")
    scores[1][3] = bad
    scores[1][5] = bad
    with pytest.raises(ValueError, match=r"layer 1: non-finite scores .* for experts \[3, 5\]"):
        lp.select_experts(scores, 0.25, allocation="uniform")


def test_empty_calibration_set() -> None:
    model = tiny_model("qwen3_moe", num_hidden_layers=2)
    with pytest.raises(ValueError, match="empty calibration set: no batches were given"):
        lp.collect_expert_stats(model, [], progress=False)


# -- ratio below top-k ------------------------------------------------------------------------------

def test_ratio_below_top_k_api() -> None:
    scores = lp.score_weights(tiny_model("qwen3_moe", num_hidden_layers=2), "aimer")  # top-2 of 8
    with pytest.raises(ValueError, match=r"ratio 0.95 prunes 7 of 8 experts in layer 0, below its floor of 2 kept "
                                         r"\(top_k=2\)"):
        lp.select_experts(scores, 0.95, allocation="uniform")


def test_ratio_below_top_k_cli(cli, tmp_path) -> None:
    run = tmp_path / "run"
    with pytest.raises(ValueError, match=r"ratio 0.95 prunes 15 of 16 experts in layer 0, below its floor of 2 kept"):
        cli(["export", "--config", "configs/aimer_tiny.yaml", "--trainer.default_root_dir", str(run),
             "--trainer.callbacks.init_args.ratio", "0.95"])
    assert not run.exists()


# -- remote code ------------------------------------------------------------------------------------

def _tampered_export(tmp_path: Path) -> tuple[Path, Path]:
    model = tiny_model("qwen3_moe", num_hidden_layers=2)
    scores = lp.score_weights(model, "aimer")
    scores[0] = torch.arange(8, dtype=torch.float32) + 100.0  # layer 0 scores far above layer 1
    scores[1] = torch.arange(8, dtype=torch.float32)
    plan = lp.select_experts(scores, 0.25, allocation="global")  # a global plan that is not uniform
    assert not plan.is_uniform
    out = tmp_path / "pruned"
    lp.export_pruned(model, plan, out)
    modeling = out / "modeling_lightprune.py"
    assert modeling.is_file()
    marker = tmp_path / "EXECUTED"
    modeling.write_text(modeling.read_text() + f"\nopen({str(marker)!r}, 'w').write('ran')\n")
    return out, marker


def test_load_never_runs_checkpoint_code_by_default(tmp_path) -> None:
    out, marker = _tampered_export(tmp_path)
    model = lp.load_pruned(out)
    assert not marker.exists()
    assert len({layer.num_experts for layer in lp.find_moe_layers(model)}) > 1  # per-layer resize ran
    model(input_ids=torch.tensor([[3, 4, 5]]))
    assert not marker.exists()


def test_checkpoint_code_runs_only_with_trust_remote_code(tmp_path) -> None:
    out, marker = _tampered_export(tmp_path)
    lp.load_pruned(out, trust_remote_code=True)
    assert marker.exists()

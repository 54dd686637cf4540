"""The lightprune command end to end on tiny checkpoints: every output file, checked values."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from fixtures import REPO

import lightprune as lp
from lightprune.cli.app import cli_main
from lightprune.testing.tiny import tiny_model

REPO = REPO


@pytest.fixture()
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "ckpt"
    tiny_model("qwen3_moe", seed=3).save_pretrained(path)
    return path


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["lightprune"])


def _run(args: list[str]):
    return cli_main(args)


@pytest.mark.exhaustive
def test_aimer_config_prunes_a_checkpoint(tmp_path: Path, checkpoint: Path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    run = tmp_path / "run"
    _run(["export", "--config", "configs/aimer.yaml", "--model.init_args.checkpoint", str(checkpoint),
          "--trainer.default_root_dir", str(run)])
    for name in ("scores.json", "plan.json", "report.json", "kept_experts.png", "model/config.json",
                 "model/model.safetensors"):
        assert (run / name).is_file(), name

    original = lp.load_pruned(checkpoint)
    plan = lp.ExpertPlan.load(run / "plan.json")
    # the plan is AIMER's: in each layer the experts with the largest AIMER value are the pruned ones
    expected = lp.select_experts(lp.score_weights(original, "aimer"), 0.5, "uniform")
    assert plan.keep == expected.keep and plan.criterion == "aimer"
    scores = json.loads((run / "scores.json").read_text())["aimer"]
    for layer, ids in plan.pruned().items():
        raw = torch.tensor(scores["raw"][str(layer)])
        assert set(ids) == set(torch.topk(raw, len(ids)).indices.tolist())

    # the exported checkpoint equals the masked original, and the report's figures are its own
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    pruned = lp.load_pruned(run / "model")
    with torch.no_grad(), lp.mask_experts(original, plan):
        masked = original(input_ids=ids).logits
    torch.testing.assert_close(pruned(input_ids=ids).logits, masked, atol=1e-5, rtol=1e-5)
    report = json.loads((run / "report.json").read_text())
    assert report["params_before"] == sum(p.numel() for p in original.parameters())
    assert report["params_after"] == sum(p.numel() for p in pruned.parameters())
    assert report["checkpoint_bytes_after"] == (run / "model" / "model.safetensors").stat().st_size
    assert report["checkpoint_bytes_before"] == (checkpoint / "model.safetensors").stat().st_size
    assert report["kept_per_layer"] == {str(l): len(k) for l, k in plan.keep.items()}
    assert report["experts_after"] == report["experts_before"] // 2


def test_aimer_tiny_job(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    run = tmp_path / "quick"
    _run(["export", "--config", "configs/aimer_tiny.yaml", "--trainer.default_root_dir", str(run)])
    report = json.loads((run / "report.json").read_text())
    assert report["experts_after"] * 2 == report["experts_before"]
    assert report["max_abs_diff"] <= 1e-5
    model = lp.load_pruned(run / "model")
    assert {l.num_experts for l in lp.find_moe_layers(model)} == {8}


def test_project_local_criterion_by_class_path(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    run = tmp_path / "custom"
    _run(["export", "--config", "configs/custom_criterion.yaml", "--trainer.default_root_dir", str(run)])
    plan = lp.ExpertPlan.load(run / "plan.json")
    assert plan.criterion == "down_proj_norm" and plan.allocation == "global"
    # independent: rank all experts by the Frobenius norm of down_proj, prune the lowest 25% overall
    model = tiny_model("mixtral")
    pairs = sorted((float(torch.linalg.vector_norm(l.experts.down_proj[e].detach().double())), l.index, e)
                   for l in lp.find_moe_layers(model) for e in range(l.num_experts))
    lowest = {(l, e) for _, l, e in pairs[: len(pairs) // 4]}
    assert {(l, e) for l, ids in plan.pruned().items() for e in ids} == lowest
    assert (run / "model" / "modeling_lightprune.py").is_file() == (not plan.is_uniform)


def test_bad_ratio_is_named(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    with pytest.raises(ValueError, match="ratio must be in \\[0, 1\\), got 1.5"):
        _run(["export", "--config", "configs/aimer_tiny.yaml", "--trainer.default_root_dir", str(tmp_path),
              "--trainer.callbacks.init_args.ratio", "1.5"])
    assert not any(tmp_path.iterdir())


@pytest.mark.exhaustive
def test_addressed_options_reach_their_callback_whatever_the_order(tmp_path: Path, monkeypatch) -> None:
    """--prune.X sets ExpertPruning's X also when another callback is listed last (where
    --trainer.callbacks.init_args.X would go), and the saved config records it."""
    import yaml

    from lightprune.cli.options import OptionError

    monkeypatch.chdir(REPO)
    run = tmp_path / "run"
    common = ["export", "--config", "configs/aimer_tiny.yaml", "--trainer.default_root_dir", str(run),
              "--trainer.callbacks+=lightprune.callbacks.ReportPage"]
    _run([*common, "--prune.ratio", "0.25", "--prune.allocation", "global", "--export.checkpoint_dir",
          str(tmp_path / "ckpt")])
    plan = lp.ExpertPlan.load(run / "plan.json")
    assert (plan.ratio, plan.allocation, plan.total_pruned) == (0.25, "global", 16)  # 4 layers x 16 x 0.25
    # Export's option, and Export is listed first
    assert (tmp_path / "ckpt" / "model.safetensors").is_file() and not (run / "model").exists()
    saved = yaml.safe_load((run / "config.yaml").read_text())["trainer"]["callbacks"]
    pruning = [c["init_args"] for c in saved if c["class_path"].endswith("ExpertPruning")]
    assert pruning[0]["ratio"] == 0.25 and pruning[0]["allocation"] == "global"
    with pytest.raises(OptionError, match="--width_search.metric: the job has no WidthSearch callback"):
        _run([*common[:4], str(tmp_path / "other"), "--width_search.metric", "exact"])
    assert not (tmp_path / "other").exists()


@pytest.mark.exhaustive
def test_a_rerun_does_not_replace_the_last_runs_checkpoint_unless_asked(tmp_path: Path, monkeypatch) -> None:
    """The shipped configs do not overwrite: a rerun in the same directory fails at setup, naming the option, and
    leaves the earlier checkpoint as it was; with --export.overwrite true it is replaced."""
    monkeypatch.chdir(REPO)
    run = tmp_path / "run"
    common = ["export", "--config", "configs/aimer_tiny.yaml", "--trainer.default_root_dir", str(run)]
    _run(common)
    weights = run / "model" / "model.safetensors"
    before = weights.read_bytes()
    with pytest.raises(FileExistsError, match="model' exists and is not empty; replace it with --export.overwrite "
                                              "true"):
        _run([*common, "--prune.ratio", "0.25"])
    assert weights.read_bytes() == before and lp.ExpertPlan.load(run / "plan.json").ratio == 0.5
    _run([*common, "--prune.ratio", "0.25", "--export.overwrite", "true"])
    assert lp.ExpertPlan.load(run / "plan.json").ratio == 0.25
    assert lp.load_pruned(run / "model").config.num_experts == 12


def test_width_export_refuses_an_existing_checkpoint_at_setup(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from lightprune.callbacks import WidthExport

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    trainer = SimpleNamespace(default_root_dir=str(tmp_path))
    with pytest.raises(FileExistsError, match="--width_export.overwrite true"):
        WidthExport().check(trainer, None, "fit")
    WidthExport(overwrite=True).check(trainer, None, "fit")


@pytest.mark.exhaustive
def test_fit_and_calibrate_run_on_synthetic_tokens(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    common = ["--model", "lightprune.finetune.MoECausalLM", "--model.init_args.tiny", "olmoe",
              "--data", "lightprune.data.SyntheticTokens", "--trainer.accelerator", "cpu",
              "--trainer.logger", "false", "--trainer.enable_checkpointing", "false",
              "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path)]
    cli = _run(["fit", *common, "--trainer.max_steps", "2"])
    assert cli.trainer.global_step == 2
    run = tmp_path / "cal"
    _run(["calibrate", *common[:-1], str(run), "--trainer.callbacks+=lightprune.callbacks.ExpertPruning",
          "--trainer.callbacks.init_args.criterion", "router_norm", "--trainer.callbacks.init_args.ratio", "0.25"])
    plan = lp.ExpertPlan.load(run / "plan.json")
    assert plan.criterion == "router_norm" and plan.total_pruned == 4


def test_console_entry_reports_bad_input_in_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    from lightprune.cli.app import main

    monkeypatch.chdir(REPO)
    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["lightprune", "export", "--config", "configs/aimer_tiny.yaml",
                                      "--trainer.default_root_dir", str(tmp_path / "run"),
                                      "--trainer.callbacks.init_args.ratio", "0.95"])
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == "lightprune: error: ratio 0.95 prunes 15 of 16 experts in layer 0, below its floor of 2 kept (top_k=2)"
    assert not (tmp_path / "run").exists()


def test_dense_model_fails_before_any_output(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    with pytest.raises(ValueError, match="no MoE layers"):
        _run(["export", "--config", "configs/aimer_tiny.yaml", "--trainer.default_root_dir", str(tmp_path / "run"),
              "--model.init_args.tiny_overrides", "{num_hidden_layers: 2, mlp_only_layers: [0, 1]}"])
    assert not (tmp_path / "run").exists()

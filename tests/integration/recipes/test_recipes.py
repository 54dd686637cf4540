"""configs/reap.yaml and configs/maep.yaml end to end on tiny checkpoints with JSONL data."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from fixtures import REPO

import lightprune as lp
from lightprune.cli.app import cli_main
from lightprune.testbed import resolve_testbed
from lightprune.testing.tiny import tiny_model

pytestmark = pytest.mark.exhaustive  # the exhaustive tier only: each recipe runs a whole job end to end


REPO = REPO
TEXT = REPO / "tests" / "fixtures" / "data" / "text.jsonl"
# the README's job on the micro text testbed (trained in seconds) instead of the small one (minutes)
MICRO_TESTBED = ["--model.init_args.checkpoint", "testbed:text-micro", "--data.init_args.preset", "micro"]


@pytest.fixture(autouse=True)
def _repo_and_argv(monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", ["lightprune"])


def _checkpoint_with_tokenizer(path: Path, family: str, seed: int):
    """A tiny checkpoint of ``family`` with a BPE tokenizer trained on the text fixture beside it."""
    from lightprune.data import train_bpe_tokenizer

    model = tiny_model(family, seed=seed)
    model.save_pretrained(path)
    texts = [json.dumps(json.loads(line)) for line in TEXT.read_text().splitlines()]
    train_bpe_tokenizer(texts, vocab_size=model.config.vocab_size).save_pretrained(path)
    return model


def test_reap_recipe_on_a_text_checkpoint(tmp_path: Path) -> None:
    from lightprune.data import TextJsonlDataModule

    ckpt = tmp_path / "ckpt"
    _checkpoint_with_tokenizer(ckpt, "qwen3_moe", seed=2)
    run = tmp_path / "run"
    cli_main(["calibrate", "--config", "configs/reap.yaml", "--model.init_args.checkpoint", str(ckpt),
              "--data.init_args.tokenizer", str(ckpt), "--data.init_args.calibration", str(TEXT),
              "--data.init_args.batch_size", "3", "--trainer.accelerator", "cpu",
              "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(run)])
    for name in ("calibration.json", "scores.json", "plan.json", "report.json", "model/config.json"):
        assert (run / name).is_file(), name
    dm = TextJsonlDataModule(str(ckpt), calibration=str(TEXT), batch_size=3, max_length=512)
    dm.setup("calibrate")
    stats = lp.collect_expert_stats(lp.load_pruned(ckpt), list(dm.calibration_dataloader()), progress=False)
    expected = lp.select_experts(stats.score("reap"), 0.5, "uniform")
    assert lp.ExpertPlan.load(run / "plan.json").keep == expected.keep


@pytest.mark.parametrize("method, config", [("hc_smoe", "configs/hc_smoe.yaml"), ("m_smoe", "configs/m_smoe.yaml")])
def test_merging_recipe_on_a_text_checkpoint(tmp_path: Path, method: str, config: str) -> None:
    """The merging recipes: the statistics from the calibration pass, the merge plan the method computes from
    them, a checkpoint that plain from_pretrained loads and that computes the reversibly merged original."""
    from transformers import AutoModelForCausalLM

    from lightprune.data import TextJsonlDataModule
    from lightprune.export.verify import default_probe, model_logits

    ckpt = tmp_path / "ckpt"
    original = _checkpoint_with_tokenizer(ckpt, "qwen3_moe", seed=3)
    run = tmp_path / "run"
    cli_main(["calibrate", "--config", config, "--model.init_args.checkpoint", str(ckpt),
              "--data.init_args.tokenizer", str(ckpt), "--data.init_args.calibration", str(TEXT),
              "--data.init_args.batch_size", "3", "--data.init_args.max_length", "512", "--trainer.accelerator", "cpu",
              "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(run)])
    plan = lp.MergePlan.load(run / "merge_plan.json")
    dm = TextJsonlDataModule(str(ckpt), calibration=str(TEXT), batch_size=3, max_length=512)
    dm.setup("calibrate")
    stats = lp.collect_expert_stats(original, list(dm.calibration_dataloader()), progress=False,
                                    criteria=["frequency", "expert_outputs", "router_logits"])
    expected = lp.hc_smoe_plan(stats, 0.5) if method == "hc_smoe" else lp.m_smoe_plan(stats, 0.5, align=True)
    assert plan.clusters == expected.clusters and plan.dominant == expected.dominant and plan.method == method
    merged = AutoModelForCausalLM.from_pretrained(run / "model")  # uniform: no lightprune, no remote code
    probe = default_probe(original)
    with lp.merged_experts(original, plan):
        reference = model_logits(original, probe)
    torch.testing.assert_close(model_logits(merged, probe), reference, rtol=0, atol=1e-5)
    report = json.loads((run / "report.json").read_text())
    assert report["kept_per_layer"] == {str(k): v for k, v in plan.kept_counts().items()}
    assert report["merge"] == {"method": method, "router": "dominant", "align": method == "m_smoe"}
    # the saved merge plan, merged again later by `lightprune export` (Export's plan_path): the same checkpoint
    config = tmp_path / "export.yaml"
    config.write_text("model:\n  class_path: lightprune.finetune.MoECausalLM\n  init_args:\n"
                      f"    checkpoint: {str(ckpt)!r}\n"
                      "trainer:\n  accelerator: cpu\n  devices: 1\n  logger: false\n  enable_checkpointing: false\n"
                      "  callbacks:\n    - class_path: lightprune.callbacks.Export\n      init_args:\n"
                      f"        plan_path: {str(run / 'merge_plan.json')!r}\n")
    cli_main(["export", "--config", str(config), "--trainer.default_root_dir", str(tmp_path / "again")])
    again, first = _tensors(tmp_path / "again" / "model"), _tensors(run / "model")
    assert set(again) == set(first) and all(torch.equal(again[k], first[k]) for k in first)


def test_a_merging_recipe_without_its_statistic_fails_at_the_first_batch(tmp_path: Path, monkeypatch) -> None:
    from lightprune.finetune import MoECausalLM

    ckpt = tmp_path / "ckpt"
    _checkpoint_with_tokenizer(ckpt, "qwen3_moe", seed=3)
    steps = []
    step = MoECausalLM.validation_step
    monkeypatch.setattr(MoECausalLM, "validation_step", lambda self, *a, **k: steps.append(1) or step(self, *a, **k))
    config = tmp_path / "hc_smoe.yaml"  # the recipe with the merging statistic left out of ExpertStats' criteria
    text = (REPO / "configs" / "hc_smoe.yaml").read_text()
    assert "criteria: [frequency, expert_outputs]" in text
    config.write_text(text.replace("criteria: [frequency, expert_outputs]", "criteria: [frequency, reap]"))
    with pytest.raises(ValueError, match="needs the calibration statistic 'expert_outputs', which this run does not"):
        cli_main(["calibrate", "--config", str(config), "--model.init_args.checkpoint", str(ckpt),
                  "--data.init_args.tokenizer", str(ckpt), "--data.init_args.calibration", str(TEXT),
                  "--data.init_args.batch_size", "1", "--trainer.accelerator", "cpu",
                  "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path / "run")])
    assert not steps  # before the first calibration batch ran


def test_reap_testbed_config_runs_on_a_fresh_machine(tmp_path: Path, monkeypatch, testbed_root: Path) -> None:
    monkeypatch.setenv("LIGHTPRUNE_CACHE", str(testbed_root))
    run = tmp_path / "run"
    cli_main(["calibrate", "--config", "configs/reap_testbed.yaml", *MICRO_TESTBED,
              "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(run)])
    plan = lp.ExpertPlan.load(run / "plan.json")
    scores = json.loads((run / "scores.json").read_text())["reap"]["importance"]
    for layer, ids in plan.keep.items():  # the 4 of 8 experts with the highest REAP per layer
        assert set(ids) == set(torch.topk(torch.tensor(scores[str(layer)]), 4).indices.tolist())
    assert json.loads((run / "report.json").read_text())["max_abs_diff"] <= 1e-5


def test_aimer_testbed_config_runs_on_a_fresh_machine(tmp_path: Path, monkeypatch, testbed_root: Path) -> None:
    """configs/aimer_testbed.yaml on the micro testbed: AIMER's plan from the testbed's weights, and Evaluate's
    held-out perplexity before and after from its own datamodule (export has none)."""
    monkeypatch.setenv("LIGHTPRUNE_CACHE", str(testbed_root))
    run = tmp_path / "run"
    cli_main(["export", "--config", "configs/aimer_testbed.yaml", "--model.init_args.checkpoint", "testbed:text-micro",
              "--evaluate.data.init_args.preset", "micro", "--evaluate.max_batches", "2",
              "--evaluate.progress", "false",
              "--trainer.default_root_dir", str(run)])
    original = lp.load_pruned(resolve_testbed("testbed:text-micro"))
    want = lp.select_experts(lp.score_weights(original, "aimer"), ratio=0.5, allocation="uniform")
    assert lp.ExpertPlan.load(run / "plan.json").keep == want.keep
    evaluation = json.loads((run / "report.json").read_text())["evaluation"]
    assert evaluation["split"] == "val" and evaluation["before"]["perplexity"] != evaluation["after"]["perplexity"]


def test_maep_testbed_config_runs_on_a_fresh_machine(tmp_path: Path) -> None:
    """configs/maep_testbed.yaml (a tiny Qwen3-VL-MoE on generated Shapes QA): the plan is MAEP's (closed-form
    alpha, global) on statistics collected afresh from the same model and calibration split."""
    from lightprune.data import ShapesQADataModule
    from lightprune.finetune import MoECausalLM

    run = tmp_path / "run"
    cli_main(["calibrate", "--config", "configs/maep_testbed.yaml", "--data.init_args.n_calibration", "8",
              "--data.init_args.root", str(tmp_path / "data"), "--trainer.enable_progress_bar", "false",
              "--trainer.default_root_dir", str(run)])
    plan = lp.ExpertPlan.load(run / "plan.json")
    dm = ShapesQADataModule("tiny:qwen3_vl_moe", root=str(tmp_path / "data"), n_train=8, n_val=8, n_selection=0,
                            n_calibration=8, batch_size=4)
    dm.setup("calibrate")
    module = MoECausalLM(tiny="qwen3_vl_moe")
    module.configure_model()
    stats = lp.collect_expert_stats(module.model, list(dm.calibration_dataloader()),
                                    subsets=("text", "vision", "vision_low_attn"), criteria=("delta_h",),
                                    progress=False)
    imp, _ = lp.maep_scores(stats)
    assert plan.criterion == "maep" and plan.keep == lp.select_experts(imp, 0.25, "global").keep
    assert json.loads((run / "report.json").read_text())["max_abs_diff"] <= 1e-5


@pytest.mark.parametrize("config", ["configs/hc_smoe_testbed.yaml", "configs/m_smoe_testbed.yaml"])
def test_merging_testbed_configs_run_on_a_fresh_machine(tmp_path: Path, monkeypatch, testbed_root: Path,
                                                        config: str) -> None:
    """The embedded variants: the testbed (micro here) trained or cached, calibrated on its own corpus, merged,
    exported; the checkpoint computes the reversibly merged testbed."""
    from lightprune.export.verify import default_probe, model_logits

    monkeypatch.setenv("LIGHTPRUNE_CACHE", str(testbed_root))
    run = tmp_path / "run"
    cli_main(["calibrate", "--config", config, *MICRO_TESTBED, "--trainer.enable_progress_bar", "false",
              "--trainer.default_root_dir", str(run)])
    plan = lp.MergePlan.load(run / "merge_plan.json")
    assert plan.kept_counts() == {l: 4 for l in plan.clusters}  # 8 experts per layer, half merged away
    original = lp.load_pruned(resolve_testbed("testbed:text-micro"))
    probe = default_probe(original)
    with lp.merged_experts(original, plan):
        reference = model_logits(original, probe)
    torch.testing.assert_close(model_logits(lp.load_pruned(run / "model"), probe), reference, rtol=0, atol=1e-5)


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        out.update(load_file(file))
    return out


@pytest.mark.parametrize("config, command", [("configs/reap.yaml", "calibrate"), ("configs/aimer.yaml", "export")])
def test_a_recipe_with_sequential_true_streams_the_checkpoint_to_the_same_result(tmp_path: Path, config: str,
                                                                               command: str, monkeypatch) -> None:
    """--model.init_args.sequential true: calibration with one decoder layer resident (the batches collected and
    run through the layers one pass at a time, each layer read once per pass), weight scores one block at a time,
    the export pruned shard by shard; the plan, the statistics and every tensor of the checkpoint equal the
    in-memory run's."""
    from lightprune.finetune import MoECausalLM

    passes = []
    flush = MoECausalLM.flush_deferred
    monkeypatch.setattr(MoECausalLM, "flush_deferred",
                        lambda self, before=None: (passes.append(len(self._deferred)), flush(self, before))[1])
    ckpt = tmp_path / "ckpt"
    _checkpoint_with_tokenizer(ckpt, "qwen3_moe", seed=2)
    data = ["--data.init_args.tokenizer", str(ckpt), "--data.init_args.calibration", str(TEXT),
            "--data.init_args.batch_size", "3"] if command == "calibrate" else []
    runs = {}
    for mode in ("memory", "sequential"):
        runs[mode] = tmp_path / mode
        cli_main([command, "--config", config, "--model.init_args.checkpoint", str(ckpt), *data,
                  "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false",
                  "--trainer.default_root_dir", str(runs[mode]),
                  *(["--model.init_args.sequential", "true"] if mode == "sequential" else [])])
    plans = {mode: lp.ExpertPlan.load(run / "plan.json") for mode, run in runs.items()}
    assert plans["sequential"].keep == plans["memory"].keep
    if command == "calibrate":
        stats = {mode: json.loads((run / "calibration.json").read_text()) for mode, run in runs.items()}
        assert stats["sequential"]["criteria"] == stats["memory"]["criteria"]
        batches = stats["memory"]["metadata"]["batches"]
        assert batches > 1 and max(passes) == batches  # one pass took every batch through each layer once
    memory, sequential = _tensors(runs["memory"] / "model"), _tensors(runs["sequential"] / "model")
    assert memory.keys() == sequential.keys()
    assert all(torch.equal(memory[k], sequential[k]) for k in memory)
    report = json.loads((runs["sequential"] / "report.json").read_text())
    assert report["streamed"] is True
    assert report["params_after"] == json.loads((runs["memory"] / "report.json").read_text())["params_after"]
    assert lp.load_pruned(runs["sequential"] / "model") is not None


def test_maep_recipe_on_a_multimodal_checkpoint(tmp_path: Path) -> None:
    from PIL import Image

    from lightprune.data import ImageTextJsonlDataModule, tiny_qwen3_vl_processor

    ckpt = tmp_path / "ckpt"
    tiny_model("qwen3_vl_moe", seed=1).save_pretrained(ckpt)
    tiny_qwen3_vl_processor().save_pretrained(ckpt)
    rows = []
    for i, (h, w) in enumerate([(16, 32), (32, 32), (24, 16), (32, 16)]):
        pixels = torch.randint(0, 256, (h, w, 3), generator=torch.Generator().manual_seed(i), dtype=torch.uint8)
        Image.fromarray(pixels.numpy()).save(tmp_path / f"{i}.png")
        rows.append({"image": f"{i}.png", "messages": [{"role": "user", "content": f"What is in picture {i}?"},
                                                        {"role": "assistant", "content": "Noise."}]})
    rows.append({"messages": [{"role": "user", "content": "No picture."}, {"role": "assistant", "content": "Ok."}]})
    calib = tmp_path / "calib.jsonl"
    calib.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    cli_main(["calibrate", "--config", "configs/maep.yaml", "--model.init_args.checkpoint", str(ckpt),
              "--data.init_args.processor", str(ckpt), "--data.init_args.calibration", str(calib),
              "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false",
              "--trainer.default_root_dir", str(run), "--trainer.callbacks.init_args.alpha", "0.5"])
    plan = lp.ExpertPlan.load(run / "plan.json")
    assert plan.criterion == "maep" and plan.metadata["alpha"]["alpha"] == 0.5
    dm = ImageTextJsonlDataModule(str(ckpt), calibration=str(calib), batch_size=2)
    dm.setup("calibrate")
    stats = lp.collect_expert_stats(lp.load_pruned(ckpt), list(dm.calibration_dataloader()),
                                    subsets=("text", "vision", "vision_low_attn"), criteria=("delta_h",),
                                    progress=False)
    imp, _ = lp.maep_scores(stats, alpha=0.5)
    assert plan.keep == lp.select_experts(imp, 0.25, "global").keep
    report = json.loads((run / "report.json").read_text())
    assert report["max_abs_diff"] <= 1e-5


def test_readme_main_job_config_runs_on_a_micro_setting(tmp_path: Path, monkeypatch, testbed_root: Path,
                                                        capsys) -> None:
    """configs/quickstart.yaml (the README's main command) end to end on the micro text testbed: the plan keeps the
    experts of highest REAP, recomputed here from the testbed and its calibration batches; the export equals the
    masked original; the summary has Evaluate's perplexity before and after."""
    from lightprune.testbed import TestbedTextDataModule

    monkeypatch.setenv("LIGHTPRUNE_CACHE", str(testbed_root))
    run = tmp_path / "run"
    cli_main(["calibrate", "--config", "configs/quickstart.yaml", *MICRO_TESTBED,
              "--evaluate.data.init_args.preset", "micro", "--evaluate.max_batches", "2",
              "--evaluate.progress", "false", "--trainer.enable_progress_bar", "false",
              "--trainer.default_root_dir", str(run)])
    plan = lp.ExpertPlan.load(run / "plan.json")
    assert plan.kept_counts() == {l: 4 for l in plan.keep} and plan.criterion == "reap"
    original = lp.load_pruned(resolve_testbed("testbed:text-micro"))  # the trained testbed, cached by the run
    data = TestbedTextDataModule(preset="micro", batch_size=8)
    data.setup("calibrate")
    stats = lp.collect_expert_stats(original, list(data.calibration_dataloader()), criteria=("reap",), progress=False)
    assert plan.keep == lp.select_experts(stats.score("reap"), 0.5, "uniform").keep
    evaluation = json.loads((run / "report.json").read_text())["evaluation"]
    before, after = evaluation["before"]["perplexity"], evaluation["after"]["perplexity"]
    summary = capsys.readouterr().out
    assert f"{before:.4g}" in summary and f"{after:.4g}" in summary and f"{100 * before / after:.1f}%" in summary
    pruned = lp.load_pruned(run / "model")
    ids = torch.randint(3, 500, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), lp.mask_experts(original, plan):
        expected = original(input_ids=ids).logits
    torch.testing.assert_close(pruned(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)


def test_router_lora_recipe_on_a_checkpoint(tmp_path: Path) -> None:
    """configs/router_lora.yaml (the paper's recipe) on a tiny checkpoint, two optimizer steps."""
    ckpt = tmp_path / "ckpt"
    original = _checkpoint_with_tokenizer(ckpt, "mixtral", seed=4)
    run = tmp_path / "run"
    cli = cli_main(["fit", "--config", "configs/router_lora.yaml", "--model.init_args.checkpoint", str(ckpt),
                    "--data.init_args.tokenizer", str(ckpt), "--data.init_args.train", str(TEXT),
                    "--data.init_args.val", str(TEXT), "--trainer.max_steps", "2",
                    "--trainer.accumulate_grad_batches", "2", "--trainer.accelerator", "cpu",
                    "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
                    "--trainer.default_root_dir", str(run)])
    assert cli.trainer.global_step == 2
    plan = lp.ExpertPlan.load(run / "plan.json")
    assert plan.criterion == "router_delta:weight" and set(plan.kept_counts().values()) == {4}
    pruned = lp.load_pruned(run / "model")
    ids = torch.randint(3, 100, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), lp.mask_experts(original, plan):
        expected = original(input_ids=ids).logits
    torch.testing.assert_close(pruned(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("qlora", [False, True], ids=["lora", "qlora"])
def test_router_lora_testbed_config_runs_on_a_fresh_machine(tmp_path: Path, monkeypatch, testbed_root: Path,
                                                            qlora: bool) -> None:
    """configs/router_lora_testbed.yaml (router_lora.yaml's recipe on the text testbed) on the micro testbed, two
    optimizer steps: the plan keeps the experts whose router rows moved most; Evaluate measures before and after;
    with 4-bit base weights (QLoRA) the export is still the full-precision original, pruned, without the adapter."""
    monkeypatch.setenv("LIGHTPRUNE_CACHE", str(testbed_root))
    run = tmp_path / "run"
    cli = cli_main(["fit", "--config", "configs/router_lora_testbed.yaml", *MICRO_TESTBED, "--trainer.max_steps", "2",
                    "--trainer.accumulate_grad_batches", "2", "--trainer.val_check_interval", "4",
                    "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
                    "--evaluate.max_batches", "1", "--evaluate.progress", "false",
                    "--model.init_args.load_in_4bit", str(qlora).lower(), "--trainer.default_root_dir", str(run)])
    assert cli.trainer.global_step == 2
    plan = lp.ExpertPlan.load(run / "plan.json")
    assert plan.kept_counts() == {l: 4 for l in plan.keep} and plan.criterion == "router_delta:weight"
    moved = json.loads((run / "scores.json").read_text())["router_delta:weight"]["importance"]
    for layer, ids in plan.keep.items():
        assert set(ids) == set(torch.topk(torch.tensor(moved[str(layer)]), 4).indices.tolist())
    assert set(json.loads((run / "report.json").read_text())["evaluation"]) >= {"before", "after"}
    pruned = lp.load_pruned(run / "model")
    assert not any(k for k in pruned.state_dict() if "lora" in k)
    original = lp.load_pruned(resolve_testbed("testbed:text-micro"))
    ids = torch.randint(3, 500, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), lp.mask_experts(original, plan):
        expected = original(input_ids=ids).logits
    torch.testing.assert_close(pruned(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)


def test_rerun_with_the_same_seed_and_data_gives_the_same_plan(tmp_path: Path, monkeypatch) -> None:
    """Twice a fine-tune-then-prune job on the testbed from an empty cache: the first run trains the micro testbed
    (inside the job, so its random state must be left as it was), the second finds it cached; same plan and
    scores."""
    monkeypatch.setenv("LIGHTPRUNE_CACHE", str(tmp_path / "cache"))
    outputs = []
    for name in ("first", "second"):
        run = tmp_path / name
        cli_main(["fit", "--config", "configs/router_lora_testbed.yaml", *MICRO_TESTBED, "--trainer.max_steps", "3",
                  "--trainer.accumulate_grad_batches", "2", "--trainer.val_check_interval", "6",
                  "--trainer.limit_val_batches", "1", "--evaluate.max_batches", "1", "--evaluate.progress", "false",
                  "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(run)])
        outputs.append(((run / "plan.json").read_text(), (run / "scores.json").read_text()))
    assert outputs[0] == outputs[1]
    assert json.loads(outputs[0][1])["router_delta:weight"]["importance"]  # scores were written


def test_mwop_recipe_searches_and_exports(tmp_path: Path, monkeypatch) -> None:
    """configs/mwop.yaml end to end (a 2-point grid): width_plan.json, search.json, a checkpoint whose kernels
    equal masking, FLOPs recomputed independently."""
    from lightprune.testing.batches import tiny_multimodal_batch
    from lightprune.width.flops import decoder_flops

    run = tmp_path / "run"
    cli_main(["fit", "--config", "configs/mwop.yaml", "--trainer.default_root_dir", str(run),
              "--trainer.enable_progress_bar", "false", "--data.init_args.root", str(tmp_path / "cache"),
              "--data.init_args.n_train", "16", "--data.init_args.n_val", "16", "--data.init_args.n_selection", "8",
              "--data.init_args.n_calibration", "8", "--trainer.callbacks.init_args.grid", "[0.0, 0.5]",
              "--trainer.callbacks.init_args.progress", "false"])
    plan = lp.WidthPlan.load(run / "width_plan.json")
    search = json.loads((run / "search.json").read_text())
    assert search["chosen"] == plan.metadata["chosen"]
    assert {c["stage"] for c in search["search"]["history"]} == {"v2v", "t2v", "t2t", "ffn_vision", "ffn_text"}
    model = lp.load_pruned(run / "model")
    config = model.config
    vision, text = plan.metadata["flops_profile"]
    expected = decoder_flops(config, vision, text, plan=plan, align=8).total / decoder_flops(config, vision, text).total
    assert plan.metadata["flops_fraction"] == pytest.approx(expected)
    batch = tiny_multimodal_batch(model, batch_size=2, seed=3)
    with torch.no_grad():
        kernels = model(**batch).logits
        model.lightprune_width.remove()
        with lp.mask_width(model, plan):
            masked = model(**batch).logits
    valid = batch["attention_mask"].bool()
    assert (kernels - masked).abs()[valid].max() < 1e-5
    assert (run / "checkpoints" / "last.ckpt").is_file()

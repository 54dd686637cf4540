"""Evaluate: perplexity and accuracies against hand computations from the logits, before/after pruning merged
into report.json, ``lightprune test``, and lm-evaluation-harness on a local task (offline)."""

from __future__ import annotations

import json
import math
import os
import sys

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from fixtures import FIXTURES

import lightprune as lp  # noqa: E402
from lightprune.callbacks import Evaluate, ExpertPruning, Export  # noqa: E402
from lightprune.callbacks.evaluate import evaluate_lm, load_lm_eval_task  # noqa: E402
from lightprune.reporting.report import merge_report  # noqa: E402

TEXT = FIXTURES / "data" / "text.jsonl"
TASK = FIXTURES / "lm_eval" / "tiny_choice.yaml"
VOCAB = 320


def _hand(model, batches, num_tasks=1, end_ids=()):
    """Perplexity, next-token and per-task token / exact accuracy by explicit loops over float64 logits; the task
    accuracies skip the labelled targets in ``end_ids`` and the labelled target right after one."""
    nll, count, hits = 0.0, 0, 0
    tok_hit, tok_tot = [0] * num_tasks, [0] * num_tasks
    ex_hit, ex_tot = [0] * num_tasks, [0] * num_tasks
    with torch.no_grad():
        for batch in batches:
            inputs = {k: v for k, v in batch.items() if k not in ("labels", "task_ids")}
            logp = torch.log_softmax(model(**inputs).logits.double(), -1)
            for b in range(batch["input_ids"].shape[0]):
                task = int(batch["task_ids"][b]) if "task_ids" in batch else 0
                all_right, any_answer, previous_end = True, False, False
                for t in range(batch["input_ids"].shape[1] - 1):
                    target = int(batch["labels"][b, t + 1])
                    if target == -100:
                        previous_end = False
                        continue
                    nll -= float(logp[b, t, target])
                    count += 1
                    right = int(logp[b, t].argmax()) == target
                    hits += right
                    if target in end_ids or previous_end:
                        previous_end = target in end_ids
                        continue
                    any_answer = True
                    tok_hit[task] += right
                    tok_tot[task] += 1
                    all_right &= right
                if any_answer:
                    ex_tot[task] += 1
                    ex_hit[task] += all_right
    return {"perplexity": math.exp(nll / count), "next_token_accuracy": hits / count,
            "token": [h / t for h, t in zip(tok_hit, tok_tot)], "exact": [h / t for h, t in zip(ex_hit, ex_tot)]}


def _end_ids(dm):
    """The datamodule tokenizer's end-of-turn marker, looked up by hand: the task accuracies leave it out."""
    return (dm.tokenizer.convert_tokens_to_ids("<|im_end|>"),)


def _batches():
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(2):
        ids = torch.randint(3, 40, (3, 7), generator=gen)
        mask = torch.ones_like(ids)
        mask[0, 5:] = 0
        labels = ids.masked_fill(mask == 0, -100)
        labels[:, :2] = -100
        labels[2, 3] = -100
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels, "task_ids": torch.tensor([0, 1, 1])})
    return out


def test_evaluate_lm_matches_hand_computation(tiny) -> None:
    model = tiny("qwen3_moe", vocab_size=48)
    batches = _batches()
    # a model that gets some answers right, so accuracies are neither 0 nor 1
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight.roll(1, 0))
    hand = _hand(model, batches, num_tasks=2)
    got = evaluate_lm(model, batches, ["a", "b"], "token")
    assert got["perplexity"] == pytest.approx(hand["perplexity"], rel=1e-5)
    assert got["loss"] == pytest.approx(math.log(hand["perplexity"]), rel=1e-5)
    assert got["next_token_accuracy"] == pytest.approx(hand["next_token_accuracy"], abs=1e-12)
    assert list(got["task_accuracy"].values()) == pytest.approx(hand["token"], abs=1e-12)
    assert got["tokens"] == sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches) and got["samples"] == 6
    exact = evaluate_lm(model, batches, ["a", "b"], "exact")
    assert list(exact["task_accuracy"].values()) == pytest.approx(hand["exact"], abs=1e-12)
    assert model.training is False


def test_evaluate_lm_bad_inputs(tiny) -> None:
    model = tiny("qwen3_moe", vocab_size=48)
    batch = _batches()[0]
    with pytest.raises(ValueError, match="'f1'"):
        evaluate_lm(model, [batch], metric="f1")
    with pytest.raises(ValueError, match=r"task_ids must be in 0..0, got \[0, 1\]"):
        evaluate_lm(model, [batch])  # two task families in the batches, one task name
    empty = {**batch, "labels": torch.full_like(batch["labels"], -100)}
    with pytest.raises(ValueError, match="no label tokens"):
        evaluate_lm(model, [empty], ["a", "b"])
    with pytest.raises(ValueError, match="'train'"):
        Evaluate(split="train")
    with pytest.raises(ValueError, match="'during'"):
        Evaluate(when=["during"])


def test_merge_report_keeps_what_it_does_not_name(tmp_path) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"params_after": 7, "evaluation": {"split": "val", "before": {"perplexity": 3.0}}}))
    merged = merge_report({"evaluation": {"after": {"perplexity": 4.0}}}, path)
    assert merged == json.loads(path.read_text()) == {
        "params_after": 7, "evaluation": {"split": "val", "before": {"perplexity": 3.0}, "after": {"perplexity": 4.0}}}
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not an object"):
        merge_report({"a": 1}, path)
    assert path.read_text() == "[1, 2]"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from lightprune.data import train_bpe_tokenizer

    texts = [json.dumps(json.loads(line)) for line in TEXT.read_text().splitlines()]
    path = tmp_path_factory.mktemp("tok")
    train_bpe_tokenizer(texts * 4, VOCAB).save_pretrained(path)
    return path


def _module():
    from lightprune.finetune import MoECausalLM

    return MoECausalLM(tiny="qwen3_moe", tiny_overrides={"vocab_size": VOCAB, "num_hidden_layers": 2})


def _datamodule(tokenizer_dir):
    from lightprune.data import TextJsonlDataModule

    return TextJsonlDataModule(str(tokenizer_dir), test=str(TEXT), val=str(TEXT), batch_size=3)


@pytest.mark.exhaustive
def test_export_run_before_and_after_merged_into_report(tmp_path, tokenizer_dir, caplog) -> None:
    import logging

    from lightprune.cli.trainer import PruneTrainer

    caplog.set_level(logging.INFO)

    dm = _datamodule(tokenizer_dir)
    # Evaluate listed first: its end-of-job step runs ExpertPruning and Export before measuring "after"
    callbacks = [Evaluate(data=dm, progress=False), ExpertPruning(criterion="magnitude", ratio=0.5),
                 Export(summary=False)]
    trainer = PruneTrainer(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=tmp_path,
                           callbacks=callbacks, enable_progress_bar=False)
    trainer.export(_module())
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["experts_after"] == report["experts_before"] // 2  # Export's report is kept
    ev = report["evaluation"]
    assert ev["split"] == "test" and ev["task_names"] == ["default"]
    original = _module()
    original.configure_model()
    before = _hand(original.model.eval(), list(dm.test_dataloader()), end_ids=_end_ids(dm))
    after = _hand(lp.load_pruned(tmp_path / "model").eval(), list(dm.test_dataloader()), end_ids=_end_ids(dm))
    for got, want in ((ev["before"], before), (ev["after"], after)):
        assert got["perplexity"] == pytest.approx(want["perplexity"], rel=1e-5)
        assert got["next_token_accuracy"] == pytest.approx(want["next_token_accuracy"], abs=1e-12)
        assert got["task_accuracy"]["default"] == pytest.approx(want["token"][0], abs=1e-12)
    assert abs(ev["before"]["perplexity"] - ev["after"]["perplexity"]) > 1e-3  # pruning changed the model
    # the export's card and manifest, written before "after" was measured, carry both once the job has ended
    manifest = json.loads((tmp_path / "model" / "lightprune_export.json").read_text())
    assert manifest["evaluation"]["before"] == ev["before"] and manifest["evaluation"]["after"] == ev["after"]
    card = (tmp_path / "model" / "README.md").read_text()
    for label in ("before", "after"):
        assert f"| {label}.perplexity | " in card, card
    assert lp.load_pruned(tmp_path / "model") is not None
    assert not [p.name for p in (tmp_path / "model").iterdir() if ".tmp-" in p.name]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Evaluate (")]
    assert lines == [f"Evaluate ({label}): perplexity {ev[label]['perplexity']:.4g}, next-token accuracy "
                     f"{ev[label]['next_token_accuracy']:.4f}, token accuracy "
                     f"{ev[label]['task_accuracy']['default']:.4f}"
                     for label in ("before", "after")]  # one task: its value, not a dict


def test_masked_after_when_nothing_prunes_in_place(tmp_path, tokenizer_dir) -> None:
    from lightprune.cli.trainer import PruneTrainer

    dm = _datamodule(tokenizer_dir)
    pruning = ExpertPruning(criterion="magnitude", ratio=0.5)
    trainer = PruneTrainer(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=tmp_path,
                           callbacks=[pruning, Evaluate(data=dm, when="after", progress=False)],
                           enable_progress_bar=False)
    module = _module()
    trainer.export(module)
    ev = json.loads((tmp_path / "report.json").read_text())["evaluation"]
    assert "before" not in ev
    with lp.mask_experts(module.model, pruning.plan):
        want = _hand(module.model, list(dm.test_dataloader()), end_ids=_end_ids(dm))
    assert ev["after"]["perplexity"] == pytest.approx(want["perplexity"], rel=1e-5)


def test_lightprune_test_writes_test_metrics(tmp_path, tokenizer_dir) -> None:
    import lightning.pytorch as pl

    dm = _datamodule(tokenizer_dir)
    (tmp_path / "report.json").write_text(json.dumps({"kept": 1}))
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=tmp_path,
                         callbacks=[Evaluate(split="val", progress=False)], enable_progress_bar=False)
    module = _module()
    trainer.test(module, datamodule=dm)
    report = json.loads((tmp_path / "report.json").read_text())
    want = _hand(module.model.eval(), list(dm.val_dataloader()), end_ids=_end_ids(dm))
    assert report["kept"] == 1 and report["evaluation"]["split"] == "val"
    assert report["evaluation"]["test"]["perplexity"] == pytest.approx(want["perplexity"], rel=1e-5)


def test_lightnings_test_loss_is_evaluates_loss(tmp_path, tokenizer_dir) -> None:
    """`lightprune test` with Evaluate shows one test loss: Lightning's test/loss is the mean over the split's label
    tokens, as Evaluate's (the log of its perplexity), also where the batches' token counts differ."""
    import lightning.pytorch as pl

    dm = _datamodule(tokenizer_dir)
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=tmp_path,
                         callbacks=[Evaluate(progress=False)], enable_progress_bar=False)
    metrics = trainer.test(_module(), datamodule=dm, verbose=False)[0]
    evaluation = json.loads((tmp_path / "report.json").read_text())["evaluation"]["test"]
    counts = {int((b["labels"][:, 1:] != -100).sum()) for b in dm.test_dataloader()}
    assert len(counts) > 1  # else a mean of batch means would agree as well
    assert metrics["test/loss"] == pytest.approx(evaluation["loss"], rel=1e-5)


def test_missing_split_and_missing_data_are_named(tmp_path, tokenizer_dir) -> None:
    from lightprune.cli.trainer import PruneTrainer
    from lightprune.data import TextJsonlDataModule

    dm = TextJsonlDataModule(str(tokenizer_dir), val=str(TEXT), batch_size=3)
    trainer = PruneTrainer(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=tmp_path,
                           callbacks=[Evaluate(data=dm, progress=False)], enable_progress_bar=False)
    with pytest.raises(ValueError, match="no 'test' split"):
        trainer.export(_module())
    trainer = PruneTrainer(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=tmp_path,
                           callbacks=[Evaluate(progress=False)], enable_progress_bar=False)
    with pytest.raises(ValueError, match="needs held-out data"):
        trainer.export(_module())
    assert not (tmp_path / "report.json").exists()


def test_lm_eval_missing_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    with pytest.raises(ImportError, match=r"lightprune\[eval\]"):
        Evaluate(lm_eval_tasks=[str(TASK)])


def test_lm_eval_task_file_checks(tmp_path) -> None:
    config = load_lm_eval_task(TASK)
    assert config["dataset_kwargs"]["data_files"]["test"] == str((TASK.parent / "tiny_choice.jsonl").resolve())
    hub = tmp_path / "hub.yaml"
    hub.write_text("task: x\ndataset_path: allenai/ai2_arc\n")
    with pytest.raises(ValueError, match="'allenai/ai2_arc'"):
        load_lm_eval_task(hub)
    missing = tmp_path / "missing.yaml"
    missing.write_text("task: x\ndataset_path: json\ndataset_kwargs: {data_files: {test: nope.jsonl}}\n")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_lm_eval_task(missing)


def test_lm_eval_local_task_offline(tiny) -> None:
    pytest.importorskip("lm_eval")
    from lightprune.callbacks.evaluate import run_lm_eval
    from lightprune.data import train_bpe_tokenizer

    rows = [json.loads(line) for line in (TASK.parent / "tiny_choice.jsonl").read_text().splitlines()]
    tok = train_bpe_tokenizer([f"{r['question']} {c}" for r in rows for c in r["choices"]] * 4, 300)
    model = tiny("qwen3_moe", vocab_size=300)
    out = run_lm_eval(model, tok, [str(TASK)], batch_size=4, log_samples=True)
    # by hand: sum of log-probabilities of " " + choice after the question; the argmax is the prediction
    right = []
    with torch.no_grad():
        for row in rows:
            ctx = tok(row["question"], add_special_tokens=False)["input_ids"]
            lls = []
            for choice in row["choices"]:
                whole = tok(row["question"] + " " + choice, add_special_tokens=False)["input_ids"]
                cont = whole[len(ctx):]
                logp = torch.log_softmax(model(input_ids=torch.tensor([whole[:-1]])).logits.double()[0], -1)
                lls.append(sum(float(logp[len(ctx) - 1 + i, t]) for i, t in enumerate(cont)))
            right.append(max(range(len(lls)), key=lls.__getitem__) == row["answer"])
            sample = next(s for s in out["samples"]["lightprune_tiny_choice"] if s["doc"] == row)
            assert [ll for ll, _ in sample["filtered_resps"]] == pytest.approx(lls, abs=1e-4)
    assert out["lightprune_tiny_choice"]["acc,none"] == pytest.approx(sum(right) / len(rows), abs=1e-12)


def test_calibrate_run_before_is_the_unobserved_original(tmp_path, tokenizer_dir) -> None:
    from lightprune.callbacks import ExpertStats
    from lightprune.cli.trainer import PruneTrainer
    from lightprune.data import TextJsonlDataModule

    dm = TextJsonlDataModule(str(tokenizer_dir), calibration=str(TEXT), test=str(TEXT), batch_size=4)

    def trainer(callbacks, root):
        return PruneTrainer(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=root,
                            callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False)

    stats = ExpertStats()
    evaluate = Evaluate(data=dm, progress=False)
    trainer([evaluate, stats, ExpertPruning(criterion="reap", ratio=0.5), Export(summary=False)],
            tmp_path / "a").calibrate(_module(), datamodule=dm)
    # the statistics saw the calibration rows only (Evaluate's batches were not observed)
    alone = ExpertStats()
    trainer([alone], tmp_path / "b").calibrate(_module(), datamodule=dm)
    assert stats.stats.to_json() == alone.stats.to_json()
    ev = json.loads((tmp_path / "a" / "report.json").read_text())["evaluation"]
    original = _module()
    original.configure_model()
    want = _hand(original.model.eval(), list(dm.test_dataloader()), end_ids=_end_ids(dm))
    assert ev["before"]["perplexity"] == pytest.approx(want["perplexity"], rel=1e-5)
    after = _hand(lp.load_pruned(tmp_path / "a" / "model").eval(), list(dm.test_dataloader()),
                  end_ids=_end_ids(dm))
    assert ev["after"]["perplexity"] == pytest.approx(after["perplexity"], rel=1e-5)
    # any order: Evaluate listed after ExpertStats (and Export before ExpertPruning) gives the same statistics,
    # the same 'before' (the run state pauses the observer for Evaluate's batches) and the same 'after'
    late = ExpertStats()
    trainer([late, Evaluate(data=dm, progress=False), Export(summary=False), ExpertPruning(criterion="reap", ratio=0.5)],
            tmp_path / "c").calibrate(_module(), datamodule=dm)
    assert late.stats.to_json() == alone.stats.to_json()
    ev_late = json.loads((tmp_path / "c" / "report.json").read_text())["evaluation"]
    assert ev_late["before"]["perplexity"] == pytest.approx(want["perplexity"], rel=1e-5)
    assert ev_late["after"]["perplexity"] == pytest.approx(after["perplexity"], rel=1e-5)
    assert (tmp_path / "c" / "plan.json").read_text() == (tmp_path / "a" / "plan.json").read_text()


def test_state_dict_keeps_before_across_a_resume() -> None:
    first = Evaluate()
    first.results = {"before": {"perplexity": 12.5}}
    resumed = Evaluate()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    resumed.on_fit_start(None, None)  # would measure (and fail on the missing trainer) if "before" were lost
    assert resumed.results == {"before": {"perplexity": 12.5}}

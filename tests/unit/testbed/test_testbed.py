"""Testbed models trained here: the text corpus, the micro text testbed, the load-balancing loss, the datamodule."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

import lightprune as lp
from lightprune.finetune import MoECausalLM
from lightprune.testbed import TEXT_TESTBEDS, TestbedTextDataModule, build_text_corpus, resolve_testbed, text_testbed
from lightprune.testbed.text_corpus import DOMAINS, _split_source
from lightprune.testbed.text_moe import corpus_datamodule
from lightprune.testbed.training import isolated_rng

MICRO = TEXT_TESTBEDS["micro"]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_split_source_returns_the_docstrings_and_blanks_them_out_of_the_code() -> None:
    doc = "Module docstring long enough to be kept as prose, well over eighty characters in all."
    src = f'"""{doc}"""\nimport os\n\n\ndef f(x):\n    """short"""\n    return x\n'
    docs, code = _split_source(src)
    assert docs == [doc]  # "short" is under the 80-character floor: dropped from both domains
    assert '"""' not in code and "import os" in code and "return x" in code


def test_corpus_splits_are_disjoint_by_source_and_hold_both_domains(testbed_root: Path) -> None:
    corpus = build_text_corpus(MICRO.corpus, testbed_root)
    sources = {split: {r["source"] for r in _rows(corpus.files[split])} for split in ("train", "val", "calibration", "test")}
    splits = list(sources)
    for i, a in enumerate(splits):
        for b in splits[i + 1:]:
            assert not sources[a] & sources[b], (a, b)
    for split in splits:
        assert {r["domain"] for r in _rows(corpus.files[split])} == set(DOMAINS), split
    calibration = _rows(corpus.files["calibration"])
    for domain in DOMAINS:
        assert _rows(corpus.files[f"calibration-{domain}"]) == [r for r in calibration if r["domain"] == domain]


def test_corpus_is_byte_identical_across_builds(testbed_root: Path, tmp_path: Path) -> None:
    a = build_text_corpus(MICRO.corpus, testbed_root)
    b = build_text_corpus(MICRO.corpus, tmp_path)
    for name, path in a.files.items():
        assert path.read_bytes() == b.files[name].read_bytes(), name
    assert (a.tokenizer_dir / "tokenizer.json").read_bytes() == (b.tokenizer_dir / "tokenizer.json").read_bytes()


def test_micro_testbed_reports_its_own_held_out_perplexity_and_learned(testbed_root: Path) -> None:
    folder = text_testbed("micro", testbed_root, progress=False)
    record = json.loads((folder / "training.json").read_text())
    curve = record["loss_curve"]
    assert curve[-1]["step"] == MICRO.steps and curve[-1]["loss"] < curve[0]["loss"] - 0.5
    assert all(math.isfinite(p["aux_loss"]) for p in curve)  # the load-balancing loss was on
    # held-out perplexity, recomputed from the saved checkpoint: exp(summed CE / labelled tokens) per domain
    model = lp.load_pruned(folder / "model").eval()
    corpus = build_text_corpus(MICRO.corpus, testbed_root)
    dm = corpus_datamodule(MICRO, corpus)
    rows = [r for r in _rows(corpus.files["test"]) if r["domain"] == "code"][: MICRO.batch_size * MICRO.eval_batches]
    nll, count = 0.0, 0
    for row in rows:
        ids = torch.tensor([(dm.tokenizer(row["text"])["input_ids"] + [dm.tokenizer.eos_token_id])[: MICRO.max_length]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1]
        nll += float(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum"))
        count += ids.shape[1] - 1
    assert record["held_out_perplexity"]["test"]["code"] == pytest.approx(math.exp(nll / count), rel=1e-4)


def test_testbed_checkpoint_name_resolves_to_the_cached_model_and_bad_names_fail(testbed_root: Path) -> None:
    assert resolve_testbed("testbed:text-micro", testbed_root) == text_testbed("micro", testbed_root) / "model"
    with pytest.raises(ValueError, match="testbed:text-small"):
        resolve_testbed("testbed:text-huge", testbed_root)
    with pytest.raises(ValueError, match="unknown testbed 'testbed:vision-micro'"):
        MoECausalLM(checkpoint="testbed:vision-micro")


def test_isolated_rng_leaves_the_random_state_as_it_was() -> None:
    torch.manual_seed(5)
    random.seed(5)
    expected = (torch.rand(3), random.random())
    torch.manual_seed(5)
    random.seed(5)
    with isolated_rng():
        torch.manual_seed(0)
        torch.rand(100)
        random.random()
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def test_training_loss_adds_the_models_load_balancing_loss(tiny) -> None:
    """MoECausalLM.training_step = next-token CE + coef x transformers' load_balancing_loss_func (recomputed)."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    from lightprune.finetune import MoECausalLM

    module = MoECausalLM(tiny="qwen3_moe", router_aux_loss_coef=0.1)
    module.configure_model()
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}
    loss = module.training_step(batch, 0)
    out = module.model(input_ids=ids, attention_mask=batch["attention_mask"], output_router_logits=True)
    ce = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 128), ids[:, 1:].reshape(-1))
    config = module.model.config
    aux = load_balancing_loss_func(out.router_logits, config.num_experts, config.num_experts_per_tok,
                                   batch["attention_mask"])
    torch.testing.assert_close(loss, ce + 0.1 * aux)
    with pytest.raises(ValueError, match="router_aux_loss_coef must be >= 0"):
        MoECausalLM(tiny="qwen3_moe", router_aux_loss_coef=-1.0)


def test_datamodule_serves_the_presets_corpus_and_one_domains_calibration(testbed_root: Path) -> None:
    dm = TestbedTextDataModule("micro", str(testbed_root), calibration_domain="prose", batch_size=2)
    corpus = build_text_corpus(MICRO.corpus, testbed_root)
    assert dm.paths["calibration"] == corpus.files["calibration-prose"]
    dm.setup("fit")
    batch = next(iter(dm.calibration_dataloader()))
    first = _rows(corpus.files["calibration-prose"])[0]["text"]
    expected = dm.tokenizer(first)["input_ids"][: MICRO.max_length]
    assert batch["input_ids"][0][: len(expected)].tolist() == expected
    with pytest.raises(ValueError, match="calibration_domain must be None or one of"):
        TestbedTextDataModule("micro", str(testbed_root), calibration_domain="poetry")
    with pytest.raises(ValueError, match="preset must be one of"):
        TestbedTextDataModule("giant", str(testbed_root))


def test_instruction_data_trains_on_the_answers_of_the_documentation_questions(testbed_root: Path,
                                                                               tmp_path: Path) -> None:
    from lightprune.data.generated.testbed_vqa import text_pool
    from lightprune.testbed.text_moe import instruction_datamodule

    corpus = build_text_corpus(MICRO.corpus, testbed_root)
    dm = instruction_datamodule(MICRO, corpus, tmp_path, batch_size=2, max_length=512)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    question, answer, _ = text_pool("train")[0]
    rows = _rows(tmp_path / "instructions.jsonl")
    assert len(rows) == len(text_pool("train")) and rows[0] == {"prompt": question + "\n", "completion": answer}
    by_text = {r["prompt"] + r["completion"] + dm.tokenizer.eos_token: r for r in rows}
    for i in range(2):  # the train split is shuffled: find each row by its text
        text = dm.tokenizer.decode([t for t, m in zip(batch["input_ids"][i].tolist(),
                                                      batch["attention_mask"][i].tolist()) if m])
        labels = [t for t in batch["labels"][i].tolist() if t != -100]
        assert dm.tokenizer.decode(labels) == by_text[text]["completion"] + dm.tokenizer.eos_token  # answer, EOS


def test_row_mean_training_loss_weighs_every_row_the_same() -> None:
    """loss_mean="row": mean over rows of each row's mean next-token CE (a short answer weighs as a long text)."""
    from lightprune.finetune import MoECausalLM

    module = MoECausalLM(tiny="qwen3_moe", loss_mean="row")
    module.configure_model()
    ids = torch.randint(0, 128, (3, 10), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[0, :8] = -100  # row 0: two labelled tokens, row 1: one, row 2: all
    labels[1, :9] = -100
    loss = module.training_step({"input_ids": ids, "labels": labels}, 0)
    with torch.no_grad():
        logits = module.model(input_ids=ids).logits[:, :-1]
    rows = []
    for r in range(3):
        keep = labels[r, 1:] != -100
        if keep.any():
            rows.append(torch.nn.functional.cross_entropy(logits[r][keep], labels[r, 1:][keep]))
    torch.testing.assert_close(loss.detach(), torch.stack(rows).mean())
    token = MoECausalLM(tiny="qwen3_moe")
    token.configure_model()
    assert not torch.allclose(token.training_step({"input_ids": ids, "labels": labels}, 0).detach(), loss.detach())
    with pytest.raises(ValueError, match="loss_mean"):
        MoECausalLM(tiny="qwen3_moe", loss_mean="sample")


def test_training_runs_on_the_callers_thread_count_and_repeats_exactly(testbed_root: Path, tmp_path: Path) -> None:
    """The micro testbed trained again from a caller with the session's thread count and deterministic algorithms
    off has the same bytes: training runs deterministically on the caller's torch threads, and the caller's settings
    come back after. The manifest records the count among the facts, the folder name holds their digest."""
    import shutil

    from lightprune.data.cache import MANIFEST
    from lightprune.testbed.training import facts_digest, training_facts

    first = text_testbed("micro", testbed_root, progress=False)
    shutil.copytree(testbed_root / "testbed", tmp_path / "testbed",  # the corpus, not the trained model
                    ignore=lambda folder, names: [n for n in names if n.startswith("text-")])
    manifest = json.loads((first / MANIFEST).read_text())
    threads = manifest["facts"]["threads"]
    before = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(False)  # a Trainer(deterministic=True) earlier in the session leaves it on
    try:
        again = text_testbed("micro", tmp_path, progress=False)
        assert torch.get_num_threads() == threads and not torch.are_deterministic_algorithms_enabled()
        assert manifest["facts"] == training_facts() and first.name.endswith(f"-{facts_digest()}")
    finally:
        torch.set_num_threads(before[0])
        torch.use_deterministic_algorithms(before[1], warn_only=before[2])
    assert again.name == first.name
    assert (again / "model" / "model.safetensors").read_bytes() == (first / "model" / "model.safetensors").read_bytes()


def test_the_thread_count_is_the_callers_and_names_another_testbed(monkeypatch, testbed_root: Path) -> None:
    """training_threads is torch's count in the calling thread (what OMP_NUM_THREADS or set_num_threads says), and
    it is in the facts, so another count is another folder."""
    from lightprune.testbed.text_moe import _folder
    from lightprune.testbed.training import training_facts, training_threads

    before = torch.get_num_threads()
    folders = {}
    try:
        for count in (1, 3):
            torch.set_num_threads(count)
            assert training_threads() == count and training_facts()["threads"] == count
            folders[count] = _folder("micro", MICRO, testbed_root)
    finally:
        torch.set_num_threads(before)
    assert folders[1] != folders[3]


def test_the_first_run_names_its_threads_and_a_busy_machine(monkeypatch, tmp_path: Path, caplog) -> None:
    """The first run's line says how many threads train the testbed and what sets them; on a machine whose load
    already fills its cores, a second line says that one thread trains faster there (and none on one thread, or
    on a quiet machine)."""
    import logging
    import shutil

    from lightprune.testbed import training

    def said(load: float, threads: int) -> list[str]:
        monkeypatch.setattr(training.os, "getloadavg", lambda: (load, load, load))
        monkeypatch.setattr(training.os, "cpu_count", lambda: 2)
        caplog.clear()
        expect = {"facts": {**training.training_facts(), "threads": threads}}
        folder = tmp_path / f"tb-{load}-{threads}"
        with caplog.at_level(logging.INFO):
            training.cached_testbed(folder, expect, lambda tmp: (tmp / "model").mkdir())
        shutil.rmtree(folder)
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("lightprune:")]

    quiet = said(0.5, 2)
    assert len(quiet) == 1 and " on 2 threads (torch's count, which OMP_NUM_THREADS sets;" in quiet[0]
    busy = said(5.0, 2)
    assert busy[0] == quiet[0].replace("tb-0.5-2", "tb-5.0-2")
    assert busy[1] == ("lightprune: this machine is busy (load 5.0 on 2 cores): 2 threads wait on each other there "
                       "and can train many times slower; OMP_NUM_THREADS=1 trains on one")
    one = said(5.0, 1)
    assert len(one) == 1 and " on 1 thread (" in one[0]


def test_the_time_left_comes_from_the_last_minute_of_steps() -> None:
    """WindowRate: steps over seconds between the first and last point of the last 60 s (at least 10 points); a
    bar's time left uses it, so one stalled step moves it by its share of the window, not several-fold."""
    import io

    from lightprune.testbed.training import WindowRate, windowed_bar

    window = WindowRate(seconds=60, min_points=10)
    assert window.rate() is None
    for i in range(121):  # a step a second for two minutes
        window.add(float(i), float(i))
    assert [p[0] for p in window.points] == [float(t) for t in range(60, 121)]
    assert window.rate() == 1.0
    window.add(150.0, 121.0)  # one step took 30 s: the window keeps 90-150
    assert window.points[0] == (90.0, 90.0) and window.rate() == 31 / 60
    slow = WindowRate(seconds=60, min_points=10)
    for i in range(12):  # 100 s a step: at least 10 points are kept, whatever their age
        slow.add(100.0 * i, float(i))
    assert len(slow.points) == 10 and slow.rate() == 9 / 900

    now = [0.0]
    bar = windowed_bar(total=1000, file=io.StringIO(), mininterval=0)
    bar._time = lambda: now[0]
    bar.window = WindowRate()
    bar.window.add(0.0, 0.0)
    for _ in range(100):
        now[0] += 0.5
        bar.update(1)
    now[0] += 30.0
    bar.update(1)
    kept = [p for p in bar.window.points]
    expected = (kept[-1][1] - kept[0][1]) / (kept[-1][0] - kept[0][0])
    assert bar.format_dict["rate"] == expected and 0.9 < expected < 1.1  # tqdm's average would fall below 0.1
    bar.close()


def test_the_loss_lines_replace_the_bar_never_join_it(caplog) -> None:
    """LossCurve logs a line per point only when asked (no bar), through a real training: a trainer sets every
    callback's ``log`` attribute to its module's method, which must not turn the lines on."""
    import logging

    import lightning.pytorch as pl

    from lightprune.testbed.training import LossCurve

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            loss = self.layer(batch[0]).pow(2).mean()
            self.log("train/loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=2)
    lines = {}
    for log in (False, True):
        curve = LossCurve(2, log=log)
        trainer = pl.Trainer(accelerator="cpu", max_steps=4, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, callbacks=[curve])
        caplog.clear()
        with caplog.at_level(logging.INFO):
            trainer.fit(Module(), data)
        lines[log] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
        assert [p["step"] for p in curve.points] == [2, 4]
    assert lines[False] == []
    assert [line.split(":")[0] for line in lines[True]] == ["step 2/4", "step 4/4"]


def test_another_machine_or_thread_count_is_another_testbed(monkeypatch, testbed_root: Path) -> None:
    from lightprune.testbed import training
    from lightprune.testbed.text_moe import _folder

    here = _folder("micro", MICRO, testbed_root)
    for key, value in (("threads", 3), ("cpu", "another CPU"), ("python", "3.99.0"), ("torch", "0.0")):
        facts = {**training.training_facts(), key: value}
        monkeypatch.setattr(training, "training_facts", lambda facts=facts: facts)
        assert _folder("micro", MICRO, testbed_root) != here, key


def test_the_training_bar_counts_every_optimizer_step_across_epochs(monkeypatch) -> None:
    """Lightning's bar counts one epoch's batches; the testbed's counts the whole training: 7 steps over 3 epochs
    of 3 batches, total 7, and it reaches 7."""
    import io

    import lightning.pytorch as pl
    import torch
    import tqdm.auto

    from lightprune.testbed.training import StepsBar

    bars = []

    class Recording(tqdm.auto.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "file": io.StringIO()})
            bars.append(self)

    monkeypatch.setattr(tqdm.auto, "tqdm", Recording)

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            loss = self.layer(batch[0]).pow(2).mean()
            self.log("train/loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(6, 2)), batch_size=2)
    trainer = pl.Trainer(accelerator="cpu", max_steps=7, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[StepsBar("testbed")])
    trainer.fit(Module(), data)
    assert len(bars) == 1 and bars[0].total == 7 and bars[0].n == 7 and trainer.current_epoch > 1

    class Failing(Module):  # an error mid-training reaches the caller as itself, the bar closed
        def training_step(self, batch, batch_idx):
            if self.global_step == 2:
                raise RuntimeError("step 2 failed")
            return super().training_step(batch, batch_idx)

    trainer = pl.Trainer(accelerator="cpu", max_steps=7, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[StepsBar("testbed")])
    with pytest.raises(RuntimeError, match="step 2 failed"):
        trainer.fit(Failing(), data)
    assert len(bars) == 2 and bars[1].n == 2 and bars[1].disable  # tqdm marks a closed bar disabled

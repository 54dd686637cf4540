"""A run's files commit together, after the export succeeded; an existing checkpoint without overwrite fails before
any work; ``--trainer.precision bf16-true`` is honoured by export; the export carries the run's tokenizer."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch
from fixtures import FIXTURES, signals_at_default
from safetensors import safe_open

import lightprune as lp
from lightprune.callbacks import ExpertPruning, ExpertStats, Export
from lightprune.cli.trainer import PruneTrainer


@pytest.fixture(autouse=True)
def _signals_as_from_a_terminal():
    """The signals these tests send act as in a command a terminal started, under ``nohup`` or in the background too."""
    with signals_at_default():
        yield


VOCAB = 160
TEXT = FIXTURES / "data" / "text.jsonl"


def _module(**overrides):
    from lightprune.finetune import MoECausalLM

    return MoECausalLM(tiny="qwen3_moe", tiny_overrides={"num_hidden_layers": 2, **overrides})


def _export(run: Path, ratio: float, overwrite: bool = True, atol: float | None = None, **trainer) -> None:
    PruneTrainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                 default_root_dir=str(run), callbacks=[Export(overwrite=overwrite, summary=False, atol=atol),
                                                       ExpertPruning("aimer", ratio=ratio)], **trainer).export(_module())


def _files(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def test_a_failed_export_leaves_the_previous_run_files(tmp_path: Path, monkeypatch) -> None:
    run = tmp_path / "run"
    _export(run, 0.5)
    before = _files(run)
    assert {"plan.json", "scores.json", "report.json", "model/model.safetensors"} <= set(before)
    from lightprune.callbacks import export as export_module

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(run / "model"))

    monkeypatch.setattr(export_module, "export_pruned", full)
    with pytest.raises(OSError, match="No space left on device"):
        _export(run, 0.25)
    assert _files(run) == before  # plan.json still describes model/ (the 50% plan), byte for byte


def test_an_existing_checkpoint_without_overwrite_fails_before_any_scoring(tmp_path: Path, monkeypatch) -> None:
    run = tmp_path / "run"
    _export(run, 0.5)
    before = _files(run)
    scored = []
    from lightprune.experts.criteria.aimer import AIMER

    monkeypatch.setattr(AIMER, "score_layer", lambda self, layer: scored.append(layer.index))
    with pytest.raises(FileExistsError, match=r"output directory '.*model' exists and is not empty; "
                                             r"replace it with --export.overwrite true"):
        _export(run, 0.25, overwrite=False)
    assert scored == [] and _files(run) == before


def test_bf16_true_precision_writes_a_bf16_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _export(run, 0.5, precision="bf16-true")  # the default tolerance: the buffers kept in fp32 reload as they were
    with safe_open(str(run / "model" / "model.safetensors"), "pt") as f:
        dtypes = {f.get_slice(name).get_dtype() for name in f.keys()}
    assert dtypes == {"BF16"}
    manifest = json.loads((run / "model" / "lightprune_export.json").read_text())
    assert manifest["dtype"] == "bfloat16" and manifest["verification"]["max_abs_diff"] == 0.0
    assert lp.load_pruned(run / "model").dtype == torch.bfloat16


def test_a_calibrate_export_carries_the_run_s_tokenizer(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from lightprune.data import TextJsonlDataModule, train_bpe_tokenizer

    tok_dir = tmp_path / "tok"
    texts = [json.loads(line)["text"] if "text" in json.loads(line) else line for line in TEXT.read_text().splitlines()]
    train_bpe_tokenizer(texts * 4, VOCAB).save_pretrained(tok_dir)
    dm = TextJsonlDataModule(str(tok_dir), calibration=str(TEXT), batch_size=4)
    run = tmp_path / "run"
    PruneTrainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                 default_root_dir=str(run),
                 callbacks=[ExpertStats(), ExpertPruning("reap", ratio=0.5), Export(summary=False)]
                 ).calibrate(_module(vocab_size=VOCAB), datamodule=dm)
    exported = AutoTokenizer.from_pretrained(run / "model")
    sentence = "def prune(model): return the experts that matter"
    assert exported(sentence)["input_ids"] == dm.tokenizer(sentence)["input_ids"]
    card = (run / "model" / "README.md").read_text()
    plan = lp.ExpertPlan.load(run / "plan.json")
    for layer, ids in plan.keep.items():
        assert ", ".join(str(i) for i in ids) in card  # the original ids of the kept experts, per layer


def test_the_default_precision_keeps_a_bf16_model_bf16(tmp_path: Path) -> None:
    run = tmp_path / "run"  # Lightning's default precision is "32-true": it does not convert the weights
    PruneTrainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                 default_root_dir=str(run), callbacks=[Export(summary=False), ExpertPruning("aimer", ratio=0.5)]
                 ).export(_module_bf16())
    with safe_open(str(run / "model" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(name).get_dtype() for name in f.keys()} == {"BF16"}


def _module_bf16():
    from lightprune.finetune import MoECausalLM

    return MoECausalLM(tiny="qwen3_moe", tiny_overrides={"num_hidden_layers": 2}, dtype="bfloat16")


def test_a_signal_once_the_checkpoint_is_in_place_waits_for_the_run_files(tmp_path: Path, monkeypatch) -> None:
    """SIGTERM right after the export renamed the new checkpoint into place: the run's plan, scores and report that
    describe it are written before the signal is raised (Interrupted, 143), never the checkpoint of one run beside
    the plan of another."""
    import os
    import signal

    from lightprune.checkpoints import staging
    from lightprune.core import interrupt

    run = tmp_path / "run"
    _export(run, 0.5)
    commit = staging._commit

    def commit_then_signal(staged, out):
        commit(staged, out)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(staging, "_commit", commit_then_signal)
    with interrupt.installed(), pytest.raises(interrupt.Interrupted) as stopped:
        _export(run, 0.25)
    assert stopped.value.exit_status == 143
    config = json.loads((run / "model" / "config.json").read_text())
    plan = json.loads((run / "plan.json").read_text())
    kept = {len(experts) for experts in plan["keep"].values()}
    assert config["num_local_experts"] == 6 and kept == {6}  # 8 experts, a quarter pruned: the new plan, the new model
    report = json.loads((run / "report.json").read_text())
    assert report["experts_after"] == 12, report  # 2 layers of 6: the report of this run, too


def test_a_run_killed_between_its_checkpoint_and_its_files_is_settled_by_the_next(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    """A kill (which runs no ``finally``) after the export renamed its checkpoint into place and before the run files
    were: the folder holds the new model beside the previous plan until the next staging of that checkpoint, which
    rolls the run's files forward from its journal."""
    import os
    import subprocess
    import sys

    from lightprune.callbacks import state as state_module
    from lightprune.checkpoints.journal import journal_path
    from lightprune.checkpoints.staging import clean_stale

    class Killed(BaseException):
        pass

    def killed(self):
        raise Killed()

    run = tmp_path / "run"
    _export(run, 0.5)
    monkeypatch.setattr(state_module.RunState, "commit_files", killed)
    monkeypatch.setattr(state_module, "settle", lambda journal: None)  # what a finally would do: a kill does not
    with pytest.raises(Killed):
        _export(run, 0.25)
    monkeypatch.undo()
    kept = lambda: {len(ids) for ids in json.loads((run / "plan.json").read_text())["keep"].values()}  # noqa: E731
    assert json.loads((run / "model" / "config.json").read_text())["num_local_experts"] == 6 and kept() == {4}
    (journal,) = run.glob(".model.lightprune-journal-*.json")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    os.rename(journal, journal_path(run / "model", child.pid))  # the journal as the killed process left it
    clean_stale(run / "model")
    assert kept() == {6} and json.loads((run / "report.json").read_text())["experts_after"] == 12
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []


def test_a_failure_to_settle_the_journal_still_ends_the_publishing_group(tmp_path: Path, monkeypatch) -> None:
    """An export step fails once the run files are aside, and settling them fails too: that error is raised, and the
    group is closed all the same, so a later Ctrl-C in the same process is not held forever."""
    import os
    import signal
    import time

    from lightprune.callbacks import state as state_module
    from lightprune.core import interrupt

    staged = tmp_path / ".model.staged"
    staged.mkdir()

    class FailingExport:
        phase = "export"

        def run(self, trainer, pl_module):
            interrupt.hold(staged, tmp_path / "model")  # the run files written aside, with their journal
            raise RuntimeError("the export failed")

    def unsettled(journal):
        raise PermissionError(13, "Permission denied", str(journal))

    monkeypatch.setattr(state_module, "settle", unsettled)
    state = state_module.RunState()
    state.stage_file(tmp_path / "plan.json", {"plan": "new"})
    state.add_job_end(FailingExport())
    with pytest.raises(PermissionError, match="Permission denied") as failed:
        state.finish_job(None, None)
    assert isinstance(failed.value.__context__, RuntimeError)
    assert (interrupt._GROUP["open"], interrupt._GROUP["holding"]) == (0, False)
    with interrupt.installed(), pytest.raises(interrupt.Interrupted):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)


def test_the_run_s_config_is_written_atomically_in_utf8_naming_the_file_on_failure(tmp_path: Path) -> None:
    from lightprune.callbacks import state as state_module

    config = tmp_path / "run" / "config.yaml"
    state_module._write_text("name: café ✓\n", str(config))
    assert config.read_bytes() == "name: café ✓\n".encode()
    (tmp_path / "run" / "config.yaml.tmp").mkdir()  # the temporary file's name taken: the write fails
    with pytest.raises(IsADirectoryError) as failed:
        state_module._write_text("name: other\n", str(config))
    assert str(failed.value) == (f"[Errno 21] could not write run file {str(config)!r}: its temporary file "
                                 f"{str(config) + '.tmp'!r} is a directory, not a file: move it away; it is as it was")
    assert config.read_text(encoding="utf-8") == "name: café ✓\n"
    (tmp_path / "run" / "config.yaml.tmp").rmdir()
    with pytest.raises(UnicodeEncodeError):  # fails once the temporary file exists: it is removed
        state_module._write_text("name: \udcff\n", str(config))
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["config.yaml"]

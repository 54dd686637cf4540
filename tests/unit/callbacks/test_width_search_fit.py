"""WidthSearch end to end on a tiny LLaVA-OneVision: a 2-point grid, one recovery epoch, and its resume.

M0 is first trained (full fine-tuning, a few steps) to answer each task with the task's token, so that
its answer accuracy, the retention reference, is well above zero; the search then runs with LoRA on the
language model and the projector trainable, as MWOP's recovery does.
"""

from __future__ import annotations

import json

import lightning.pytorch as pl
import pytest
import torch

from lightprune.callbacks.width_search import WidthSearch
from lightprune.finetune import AdapterSpec, MoECausalLM
from lightprune.testing.batches import tiny_multimodal_batch
from lightprune.testing.tiny import tiny_model
from lightprune.width.paths import PATHS
from lightprune.width.plan import WidthPlan
from lightprune.width.select import select_channels, select_paths

TASK_MARKERS = (20, 21)  # first and last prompt token: which task the sample is
ANSWERS = (5, 9)  # each task's answer token


def _batch(model, seed: int) -> dict[str, torch.Tensor]:
    batch = tiny_multimodal_batch(model, batch_size=2, text_tokens=(2, 4), seed=seed, pad_last=1)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    labels = torch.full_like(ids, -100)
    tasks = torch.tensor([seed % 2, (seed + 1) % 2])
    for b in range(ids.shape[0]):
        valid = mask[b].nonzero().flatten()
        ids[b, valid[0]] = ids[b, valid[-2]] = TASK_MARKERS[tasks[b]]  # the prompt opens and ends with it
        ids[b, valid[-1]] = ANSWERS[tasks[b]]
        labels[b, valid[-1]] = ANSWERS[tasks[b]]
    return {**batch, "labels": labels, "task_ids": tasks}


class TaskData(pl.LightningDataModule):
    task_names = ["first", "second"]

    def __init__(self, model):
        super().__init__()
        self.train = [_batch(model, s) for s in range(4)]
        self.val = [_batch(model, s) for s in range(10, 13)]
        self.selection = [_batch(model, s) for s in range(20, 22)]
        self.calibration = [_batch(model, s) for s in range(30, 32)]

    def train_dataloader(self):
        return _loader(self.train)

    def val_dataloader(self):
        return _loader(self.val)

    def selection_dataloader(self):
        return _loader(self.selection)

    def calibration_dataloader(self):
        return _loader(self.calibration)


def _loader(batches):
    return torch.utils.data.DataLoader(batches, batch_size=None)


@pytest.fixture(scope="module")
def m0_checkpoint(tmp_path_factory):
    """A tiny LLaVA-OneVision that answers both tasks (full fine-tuning), saved as a checkpoint directory."""
    model = tiny_model("llava_onevision", seed=0).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batches = [_batch(model, s) for s in range(4)]
    for step in range(20):
        batch = batches[step % 4]
        logits = model(**{k: v for k, v in batch.items() if k not in ("labels", "task_ids")}).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(),
                                                 ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    path = tmp_path_factory.mktemp("m0")
    model.eval().save_pretrained(path)
    return str(path)


def _module(checkpoint: str) -> MoECausalLM:
    return MoECausalLM(checkpoint=checkpoint, learning_rate=1e-3, warmup_steps=1,
                       adapter=AdapterSpec(kind="lora", targets=["language_model"], r=4, alpha=8, dropout=0.0,
                                           trainable=["multi_modal_projector"]))


def _fit(checkpoint, out, callbacks=(), ckpt_path=None):
    search = WidthSearch(grid=[0.0, 0.5], min_retention=50.0, max_candidates=1, recovery_epochs=1,
                         progress=False, output_dir=str(out), align=1)
    module = _module(checkpoint)
    module.configure_model()
    data = TaskData(module.model)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                         callbacks=[search, *callbacks], default_root_dir=str(out), deterministic=True)
    pl.seed_everything(0)
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return search, module, trainer


@pytest.fixture(scope="module")
def whole_run(m0_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("search")
    search, module, trainer = _fit(m0_checkpoint, out)
    return search, module, trainer, out


@pytest.mark.exhaustive
def test_search_runs_every_stage_and_writes_its_plan(whole_run):
    search, module, trainer, out = whole_run
    record = json.loads((out / "search.json").read_text())
    history = record["search"]["history"]
    assert [c["stage"] for c in history][:1] == ["v2v"]
    assert {c["stage"] for c in history} == {"v2v", "t2v", "t2t", "ffn_vision", "ffn_text"}
    assert trainer.current_epoch == len(history)  # one recovery epoch per recovered candidate
    plan = WidthPlan.load(out / "width_plan.json")
    assert plan == search.plan and record["chosen"] == plan.metadata["chosen"]
    assert all(c["training_free_atr"] is not None for c in history)
    # the final choice follows Algorithm 1's revisit rule, recomputed here from the recorded history
    anchors = record["search"]["anchors"]
    best = anchors["ffn_text"]
    for c in history:
        if c["atr"] > best["atr"] and c["flops"] < best["flops"]:
            best = c
    assert record["chosen"] == f"{best['stage']}@{best['ratio']:g}"


def test_candidates_are_cumulative_selections_of_the_taylor_scores(whole_run):
    search, module, _, out = whole_run
    state = search.state_dict()
    history = state["search"]["history"]
    anchors = state["search"]["anchors"]
    plan = WidthPlan.dense(module.model)
    for stage in ("v2v", "t2v", "t2t"):
        expected = select_paths(state["attn_scores"], {stage: anchors[stage]["ratio"]}, plan)
        assert WidthPlan.from_dict(anchors[stage]["plan"]) == expected
        plan = expected
    for stage in ("ffn_vision", "ffn_text"):
        expected = select_channels(state["ffn_scores"], {stage[4:]: anchors[stage]["ratio"]}, plan)
        assert WidthPlan.from_dict(anchors[stage]["plan"]) == expected
        plan = expected
    for candidate in history:  # each candidate's ratio shows in its own unit's pruned fraction
        unit = candidate["stage"]
        fraction = WidthPlan.from_dict(candidate["plan"]).pruned_fraction(unit)
        total = sum(plan.num_heads.values()) if unit in PATHS else sum(plan.intermediate_size.values())
        assert fraction == round(candidate["ratio"] * total) / total


def test_model_ends_with_the_chosen_weights_and_masks(whole_run):
    search, module, _, out = whole_run
    chosen = search.search.final()
    saved = torch.load(chosen.weights, weights_only=True)
    params = {n: p for n, p in module.model.named_parameters() if p.requires_grad}
    assert all(torch.equal(params[n].detach(), saved[n]) for n in saved)
    data = TaskData(module.model)
    from lightprune.width.retention import evaluate_tasks, retention

    scores = evaluate_tasks(module.model, data.val, 2)
    ref = torch.tensor(search.state_dict()["reference"], dtype=torch.float64)
    assert retention(scores, ref, TaskData.task_names).atr == pytest.approx(chosen.atr)


class Interrupt(pl.Callback):
    def __init__(self, at_epoch: int):
        self.at_epoch = at_epoch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.current_epoch == self.at_epoch and batch_idx == 1:
            raise RuntimeError("killed")


def test_an_interrupted_search_resumes_to_the_same_result(whole_run, m0_checkpoint, tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    search, _, _, _ = whole_run
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=-1)
    with pytest.raises(RuntimeError, match="killed"):
        _fit(m0_checkpoint, tmp_path / "run", callbacks=[Interrupt(3), ckpt])
    resumed, _, trainer = _fit(m0_checkpoint, tmp_path / "run",
                               callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)],
                               ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    whole, again = search.search, resumed.search
    assert [c.label() for c in again.history] == [c.label() for c in whole.history]
    assert [c.plan for c in again.history] == [c.plan for c in whole.history]
    assert [c.atr for c in again.history] == pytest.approx([c.atr for c in whole.history], abs=1e-9)
    assert resumed.plan == search.plan
    # the finished search resumed again (its fit ends at once): its plan is the run's, and WidthExport writes it
    from lightprune.callbacks import WidthExport
    from lightprune.callbacks.state import RunState

    finished, _, trainer = _fit(m0_checkpoint, tmp_path / "run", callbacks=[WidthExport(align=1)],
                                ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert not finished.search.history[len(whole.history):]  # nothing searched again
    assert finished.plan == search.plan and RunState.of(trainer).width_plan == search.plan
    assert WidthPlan.load(tmp_path / "run" / "model" / "width_plan.json") == search.plan
    # a checkpoint from before the plan was part of the state: the plan of the search's choice
    old = WidthSearch(grid=[0.0, 0.5], min_retention=50.0, max_candidates=1, recovery_epochs=1, progress=False)
    state = dict(finished.state_dict())
    del state["plan"]
    old.load_state_dict(state)
    masks = [{k: v for k, v in plan.to_dict().items() if k != "metadata"} for plan in (old.plan, search.plan)]
    assert masks[0] == masks[1] and old.plan.metadata["chosen"] == search.plan.metadata["chosen"]


def test_width_export_writes_the_chosen_model(m0_checkpoint, tmp_path):
    """Search, then export: the reloaded checkpoint (kernels swapped in) equals the searched, masked model."""
    from lightprune.callbacks import WidthExport
    from lightprune.export import load_pruned

    from lightprune.callbacks.state import RunState

    export = WidthExport(align=1)
    search, module, trainer = _fit(m0_checkpoint, tmp_path, callbacks=[export])
    assert RunState.of(trainer).exported == tmp_path / "model"  # where Evaluate records what it measures after
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["search"]["chosen"] == search.plan.metadata["chosen"]
    assert report["verification"]["max_abs_diff"] <= 1e-5
    reloaded = load_pruned(tmp_path / "model")
    assert WidthPlan.load(tmp_path / "model" / "width_plan.json") == search.plan
    data = TaskData(reloaded)
    from lightprune.width.retention import evaluate_tasks, retention

    ref = torch.tensor(search.state_dict()["reference"], dtype=torch.float64)
    assert retention(evaluate_tasks(reloaded, data.val, 2), ref, TaskData.task_names).atr == \
        pytest.approx(search.search.final().atr)

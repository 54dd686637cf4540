"""StagedSearch (Algorithm 1's decisions) and retention / TaskAccuracy against hand computations."""

from __future__ import annotations

import json
import math

import pytest
import torch

from lightprune.width.retention import TaskAccuracy, answer_mask, answer_row_sums, retention, task_scores
from lightprune.width.search import Candidate, StagedSearch

GRID = (0.0, 0.2, 0.4, 0.6, 0.8)


def _tf(stage_offset: float):
    # training-free retention falls with the ratio
    return {r: 100.0 - 40 * r - stage_offset for r in GRID}


def _recovered(stage: str, ratio: float) -> float:
    # recovery restores up to 101 for small ratios
    return {"v2v": 101.2, "t2v": 100.5, "t2t": 99.0, "ffn_vision": 102.0, "ffn_text": 98.0}[stage] - 10 * ratio ** 2


def _flops(stage: str, ratio: float) -> float:
    return 100.0 - 10 * ("v2v", "t2v", "t2t", "ffn_vision", "ffn_text").index(stage) - 5 * ratio


def _run(search: StagedSearch, interrupt_after: int | None = None) -> tuple[StagedSearch, list[str]]:
    order, steps = [], 0
    while not search.done:
        if not search.swept:
            search.start_stage(_tf(search.stage_index))
        ratio = search.next_ratio()
        if ratio is None:
            search.finish_stage()
            continue
        search.record(Candidate(search.stage, ratio, {"cumulative": [search.stage, ratio]},
                                _recovered(search.stage, ratio), {}, _flops(search.stage, ratio)))
        order.append(f"{search.stage}@{ratio:g}")
        steps += 1
        if interrupt_after is not None and steps == interrupt_after:
            # what a checkpoint carries: JSON, then a fresh object
            search = StagedSearch.from_dict(json.loads(json.dumps(search.to_dict())))
            interrupt_after = None
    return search, order


def test_drop_candidates_expand_and_anchor_by_hand():
    search = StagedSearch(grid=GRID, min_retention=85.0, max_candidates=2)
    assert search.start_stage(_tf(0)) == [0.2, 0.0]  # TF >= 85 at 0, 0.2 (84 at 0.4 fails); largest first
    # v2v: 0.2 -> 100.8 and 0.0 -> 101.2: the largest tested still reaches 100, so 0.4 is queued;
    # 0.4 -> 99.6 < 100 stops the expansion; the anchor is the closest to 100: 0.4 (0.4 away) over 0.2 (0.8)
    search, order = _run(search)
    assert order[:4] == ["v2v@0.2", "v2v@0", "v2v@0.4", "t2v@0.2"]
    assert search.anchors["v2v"].ratio == 0.4
    assert all(c.training_free_atr is not None for c in search.history)
    # every finished stage keeps its whole sweep (for reports), not only its candidates' points
    assert search.sweeps == {stage: {round(r, 6): v for r, v in _tf(i).items()} for i, stage in enumerate(search.stages)}


def test_final_revisit_takes_higher_atr_and_lower_flops_only():
    search, _ = _run(StagedSearch(grid=GRID, min_retention=85.0, max_candidates=2))
    best = search.anchors["ffn_text"]
    for c in search.history:  # the independent rule: in order, switch on strictly better in both
        if c.atr > best.atr and c.flops < best.flops:
            best = c
    assert search.final().label() == best.label()


@pytest.mark.parametrize("interrupt_after", [1, 3, 7])
def test_json_round_trip_mid_search_gives_the_same_search(interrupt_after):
    whole, order = _run(StagedSearch(grid=GRID, min_retention=85.0))
    resumed, order2 = _run(StagedSearch(grid=GRID, min_retention=85.0), interrupt_after)
    assert order == order2
    assert resumed.to_dict() == whole.to_dict()


def test_nothing_passing_takes_the_smallest_ratio_and_expands_down_never_below_grid():
    search = StagedSearch(grid=(0.3, 0.6), stages=["t2v"], min_retention=99.0)
    assert search.start_stage({0.3: 50.0, 0.6: 40.0}) == [0.3]
    search.record(Candidate("t2v", 0.3, {}, 80.0, {}, 1.0))
    assert search.next_ratio() is None  # below min_retention but no smaller grid ratio
    assert search.finish_stage().ratio == 0.3 and search.done


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="1.5"):
        StagedSearch(grid=(0.0, 1.5))
    with pytest.raises(ValueError, match="t2v"):
        StagedSearch(stages=["t2v", "v2v"])
    search = StagedSearch(grid=(0.0, 0.5), stages=["v2v"])
    with pytest.raises(ValueError, match="grid"):
        search.start_stage({0.0: 100.0})
    search.start_stage({0.0: 100.0, 0.5: 99.0})
    with pytest.raises(ValueError, match="v2v@0.5"):
        search.record(Candidate("v2v", 0.0, {}, 100.0, {}, 1.0))


def test_task_accuracy_token_and_exact_by_hand():
    # 3 samples, vocab 4; labels shifted: prediction at t is compared with label at t + 1
    labels = torch.tensor([[-100, 1, 2, -100], [-100, -100, 3, 0], [-100, 2, -100, -100]])
    pred = torch.tensor([[1, 2, 0, 0], [0, 3, 1, 0], [2, 0, 0, 0]])  # argmax per position
    logits = torch.nn.functional.one_hot(pred, 4).float()
    tasks = torch.tensor([0, 1, 0])
    token = TaskAccuracy(2, "token")
    token.update(logits, labels, tasks)
    # sample 0: positions 0,1 predict 1,2 vs labels 1,2 -> 2/2; sample 2: predicts 2 vs 2 -> 1/1; sample 1: 3 vs 3, 1 vs 0
    assert token.compute().tolist() == [1.0, 0.5]
    exact = TaskAccuracy(2, "exact")
    exact.update(logits, labels, tasks)
    assert exact.compute().tolist() == [1.0, 0.0]


END = 7  # an end-of-turn id; 8 stands for the newline a ChatML turn puts after it


def test_end_of_turn_markers_and_the_position_after_are_not_answer_tokens():
    # row 0: answer 1 2 <end> <newline>; row 1: answer 3 <end> (no newline), then an unlabelled header; row 2: a
    # second turn's answer after the first one's end
    labels = torch.tensor([[-100, 1, 2, END, 8, -100], [-100, -100, 3, END, -100, -100],
                           [-100, 4, END, 8, -100, 5]])
    assert answer_mask(labels, (END,)).tolist() == [[True, True, False, False, False],
                                                     [False, True, False, False, False],
                                                     [True, False, False, False, True]]
    assert torch.equal(answer_mask(labels), labels[:, 1:] != -100)
    # predictions right on the answers, wrong on the markers: whole-answer match only once the markers are left out
    pred = torch.tensor([[1, 2, 0, 0, 0, 0], [0, 3, 0, 0, 0, 0], [4, 0, 0, 0, 5, 0]])
    logits = torch.nn.functional.one_hot(pred, 9).float()
    with_markers, without = TaskAccuracy(1, "exact"), TaskAccuracy(1, "exact", end_ids=(END,))
    with_markers.update(logits, labels)
    without.update(logits, labels)
    assert float(with_markers.compute()) == 0.0 and float(without.compute()) == 1.0


class _Logits(torch.nn.Module):
    """A 'model' whose logits are given per batch (by its input_ids' first entry)."""

    def __init__(self, logits):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.logits = logits

    def forward(self, input_ids, **kwargs):
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.logits[int(input_ids[0, 0])])


def test_answer_row_sums_agree_with_task_accuracy_and_cross_entropy():
    gen = torch.Generator().manual_seed(3)
    logits = [torch.randn(2, 6, 9, generator=gen) for _ in range(2)]
    labels = [torch.tensor([[-100, 1, 2, END, 8, -100], [-100, -100, 3, END, -100, -100]]),
              torch.tensor([[-100, 4, END, 8, -100, 5], [-100, 6, 6, -100, -100, -100]])]
    batches = [{"input_ids": torch.full((2, 6), i), "labels": labels[i], "task_ids": torch.tensor([0, 1])}
               for i in range(2)]
    rows = answer_row_sums(_Logits(logits), batches, 2, end_ids=(END,))
    assert rows["task"].tolist() == [0, 1, 0, 1] and rows["tokens"].tolist() == [2, 1, 2, 2]
    for metric, key in (("token", "right"), ("exact", "exact"), ("prob", "prob")):
        acc = TaskAccuracy(2, metric, end_ids=(END,))
        for lg, batch in zip(logits, batches):
            acc.update(lg, batch["labels"], batch["task_ids"])
        den = rows["answered"] if metric == "exact" else rows["tokens"]
        by_task = [float(rows[key][rows["task"] == t].sum() / den[rows["task"] == t].sum()) for t in (0, 1)]
        assert acc.compute().tolist() == pytest.approx(by_task, rel=1e-6)
        assert task_scores(rows, 2, metric).tolist() == pytest.approx(acc.compute().tolist(), rel=1e-6)
    expected = []
    for lg, lab in zip(logits, labels):
        mask = answer_mask(lab, (END,))
        for r in range(2):
            logp = torch.log_softmax(lg[r, :-1].double(), -1)
            expected.append(float(sum(-logp[t, lab[r, t + 1]] for t in range(5) if mask[r, t])))
    assert rows["nll"].tolist() == pytest.approx(expected, rel=1e-5)


def test_task_accuracy_prob_is_the_mean_answer_probability():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 6, generator=gen)
    labels = torch.tensor([[-100, 3, -100, 1], [-100, -100, 5, -100]])
    metric = TaskAccuracy(1, "prob")
    metric.update(logits, labels)
    probs = torch.softmax(logits.double(), -1)
    expected = (probs[0, 0, 3] + probs[0, 2, 1] + probs[1, 1, 5]) / 3
    assert metric.compute().item() == pytest.approx(expected.item(), rel=1e-12)


def test_retention_excludes_undefined_tasks_by_name():
    r = retention(torch.tensor([0.5, 0.2, 0.3]), torch.tensor([0.4, 0.0, 0.6]), ["a", "b", "c"])
    assert r.per_task["a"] == pytest.approx(125.0) and math.isnan(r.per_task["b"])
    assert r.excluded == ["b"] and r.atr == pytest.approx((125.0 + 50.0) / 2)
    with pytest.raises(ValueError, match="undefined"):
        retention(torch.tensor([0.5]), torch.tensor([0.0]), ["a"])


def test_an_unchanged_model_retains_exactly_100_percent():
    """100 * (s / r), not 100 * s / r: the latter is 100 +- 1 ulp for some s == r (the anchor is 'closest to 100')."""
    scores = torch.arange(1, 100, dtype=torch.float64) / 100  # 0.17, 0.34, 0.68, 0.69: 100 * s / s != 100
    r = retention(scores, scores.clone(), [str(i) for i in range(len(scores))])
    assert all(v == 100.0 for v in r.per_task.values()) and r.atr == 100.0


def test_a_candidate_below_min_retention_queues_the_next_smaller_ratio():
    search = StagedSearch(grid=(0.0, 0.3, 0.6), stages=["t2t"], min_retention=90.0, max_candidates=1)
    assert search.start_stage({0.0: 100.0, 0.3: 95.0, 0.6: 92.0}) == [0.6]
    search.record(Candidate("t2t", 0.6, {}, 80.0, {}, 1.0))
    assert search.next_ratio() == 0.3
    search.record(Candidate("t2t", 0.3, {}, 95.0, {}, 2.0))
    assert search.next_ratio() is None  # 95 is above min_retention and below expand_above
    assert search.finish_stage().ratio == 0.3

"""Answer accuracy per task family and retention against a reference (the ATR of MWOP ("MWOP: Modality-aware
Width-wise Operation Pruning for Efficient MLLMs"), section 6.1).

The paper scores each benchmark, normalises it to the dense reference and averages: ATR (average task
retention) = mean over task families f of 100 * score_f(candidate) / score_f(reference). Here a task
family's score is its teacher-forced answer accuracy on held-out data:

- ``token``: the fraction of answer tokens (labels != -100, next-token shifted) whose argmax is right;
- ``exact``: the fraction of samples whose every answer token is right (a whole-answer match);
- ``prob``: the mean probability the model gives the right answer token (teacher-forced). Not a paper
  metric: a continuous score that stays above zero for an untrained model (a random tiny model answers
  nothing right, so its accuracy cannot be a reference), for smoke runs and tiny defaults.

Answer tokens are the labelled next-token targets (labels != -100) less the end-of-turn markers ``end_ids``
(`lightprune.data.tokenizer.end_of_turn_ids`) and the labelled position right after one (ChatML's newline
after ``<|im_end|>``): a chat template makes them part of every trained answer, and predicting them is not
answering (`answer_mask`). `row_sums` gives every metric's per-row sums (TaskAccuracy sums them by
task; `answer_row_sums` keeps them per row, for bootstrap intervals and the answer log-likelihood).

`TaskAccuracy` is a torchmetrics ``Metric`` (states summed across ranks by torchmetrics' own sync);
`evaluate_tasks` runs it over batches carrying ``task_ids`` [B] (index into the task names; a batch
without them counts as task 0). A task whose reference score is 0 has no defined retention: it is left
out of the ATR and named in `Retention.excluded`, never silently counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import torch
from torchmetrics import Metric

from lightprune.core.batch import model_inputs
from lightprune.core.choices import RETENTION_METRICS

__all__ = ["TaskAccuracy", "answer_mask", "answer_row_sums", "evaluate_tasks", "Retention", "retention", "METRICS",
           "METRIC_SUMS", "row_sums", "task_scores"]

METRICS = RETENTION_METRICS


def answer_mask(labels: torch.Tensor, end_ids: Sequence[int] = ()) -> torch.Tensor:
    """[B, T - 1] the answer positions of the next-token targets ``labels[:, 1:]``: labelled, not an end-of-turn
    marker of ``end_ids`` and not the labelled position right after one."""
    target = labels[:, 1:]
    answer = target != -100
    if len(end_ids):
        end = torch.isin(target, torch.as_tensor(list(end_ids), dtype=target.dtype, device=target.device)) & answer
        after = torch.zeros_like(end)
        after[:, 1:] = end[:, :-1]
        answer = answer & ~end & ~after
    return answer


def _task_ids(labels: torch.Tensor, task_ids: torch.Tensor | None, num_tasks: int) -> torch.Tensor:
    tasks = torch.zeros(labels.shape[0], dtype=torch.long, device=labels.device) if task_ids is None \
        else task_ids.to(labels.device).long()
    if tasks.numel() and (tasks.min() < 0 or tasks.max() >= num_tasks):
        raise ValueError(f"task_ids must be in 0..{num_tasks - 1}, got {tasks.unique().tolist()}")
    return tasks


#: the keys of :func:`row_sums` whose ratio is each metric's score (numerator, denominator)
METRIC_SUMS: dict[str, tuple[str, str]] = {"token": ("right", "tokens"), "exact": ("exact", "answered"),
                                           "prob": ("prob", "tokens")}


def row_sums(logits: torch.Tensor, labels: torch.Tensor, end_ids: Sequence[int] = (),
             likelihood: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Per row of one batch, float64 [B]: ``tokens`` (answer tokens, `answer_mask`), ``right`` (those whose
    argmax is right), ``exact`` (1 when the row has answer tokens and every one is right) and ``answered`` (1 when it
    has answer tokens); with ``likelihood`` (the dtype of the log-softmax) also ``nll`` (the answer tokens' negative
    log-likelihood sum) and ``prob`` (the sum of the right answer tokens' probabilities)."""
    target = labels[:, 1:]
    answer = answer_mask(labels, end_ids)
    hit = (logits[:, :-1].argmax(-1) == target) & answer
    answered = answer.any(1)
    out = {"tokens": answer.sum(1), "right": hit.sum(1), "exact": (hit == answer).all(1) & answered,
           "answered": answered}
    if likelihood is not None:
        logp = torch.log_softmax(logits[:, :-1].to(likelihood), -1)
        nll = -logp.gather(-1, target.clamp_min(0).unsqueeze(-1)).squeeze(-1).double()
        out.update(nll=(nll * answer).sum(1), prob=((-nll).exp() * answer).sum(1))
    return {k: v.double() for k, v in out.items()}


class TaskAccuracy(Metric):
    """Answer accuracy per task family: ``compute()`` gives a float64 [num_tasks] tensor (NaN: no samples).
    ``end_ids``: the end-of-turn markers that are not answer tokens (`answer_mask`)."""

    full_state_update = False

    def __init__(self, num_tasks: int, metric: str = "token", end_ids: Sequence[int] = (), **kwargs: Any):
        super().__init__(**kwargs)
        self.end_ids = tuple(int(i) for i in end_ids)
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {list(METRICS)}, got {metric!r}")
        if int(num_tasks) != num_tasks or num_tasks < 1:
            raise ValueError(f"num_tasks must be a positive integer, got {num_tasks!r}")
        self.metric = metric
        self.num_tasks = int(num_tasks)
        self.add_state("correct", torch.zeros(self.num_tasks, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros(self.num_tasks, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, labels: torch.Tensor, task_ids: torch.Tensor | None = None) -> None:
        tasks = _task_ids(labels, task_ids, self.num_tasks)
        sums = row_sums(logits, labels, self.end_ids, torch.float64 if self.metric == "prob" else None)
        num, den = METRIC_SUMS[self.metric]
        self.correct.index_add_(0, tasks, sums[num].to(self.correct.device))
        self.total.index_add_(0, tasks, sums[den].to(self.total.device))

    def compute(self) -> torch.Tensor:
        return self.correct / self.total


def _teacher_forced(model: torch.nn.Module, batches: Iterable[Mapping[str, Any]], progress: bool = False,
                    desc: str = "evaluate"):
    """(logits, labels, task ids or None) of every batch in eval mode on the model's device (the caller holds no_grad);
    the model's mode is restored when the batches end (or the loop stops)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc=desc, unit="batch", leave=False)
    try:
        for batch in batches:
            if "labels" not in batch:
                raise ValueError("evaluation batches need labels (-100 outside the answer)")
            yield model(**model_inputs(batch, device=device)).logits, batch["labels"].to(device), batch.get("task_ids")
    finally:
        model.train(was_training)


@torch.no_grad()
def evaluate_tasks(model: torch.nn.Module, batches: Iterable[Mapping[str, Any]], num_tasks: int,
                   metric: str = "token", progress: bool = False, desc: str = "evaluate",
                   end_ids: Sequence[int] = ()) -> torch.Tensor:
    """Teacher-forced answer accuracy per task of ``model`` over ``batches`` (model left in its mode)."""
    acc = TaskAccuracy(num_tasks, metric, end_ids).to(next(model.parameters()).device)
    for logits, labels, task_ids in _teacher_forced(model, batches, progress, desc):
        acc.update(logits, labels, task_ids)
    if float(acc.total.sum()) == 0:
        raise ValueError("evaluation set is empty: no answer tokens (labels != -100) in any batch")
    return acc.compute().cpu()


@torch.no_grad()
def answer_row_sums(model: torch.nn.Module, batches: Iterable[Mapping[str, Any]], num_tasks: int,
                    end_ids: Sequence[int] = ()) -> dict[str, torch.Tensor]:
    """Per row of ``batches`` (in order), teacher forced, float64 [rows] on the CPU: ``task`` (its task id) and
    `row_sums` with the likelihoods (float32 log-softmax). Model left in its mode."""
    rows: dict[str, list[torch.Tensor]] = {}
    for logits, labels, task_ids in _teacher_forced(model, batches):
        sums = {"task": _task_ids(labels, task_ids, num_tasks).double(),
                **row_sums(logits.float(), labels, end_ids, torch.float32)}
        for key, value in sums.items():
            rows.setdefault(key, []).append(value.cpu())
    if not rows or float(torch.cat(rows["tokens"]).sum()) == 0:
        raise ValueError("evaluation set is empty: no answer tokens (labels != -100) in any batch")
    return {k: torch.cat(v) for k, v in rows.items()}


def task_scores(rows: Mapping[str, torch.Tensor], num_tasks: int, metric: str) -> torch.Tensor:
    """Per task, ``metric``'s score from `answer_row_sums` (float64 [num_tasks], NaN: no rows), as
    `TaskAccuracy` computes it."""
    num, den = METRIC_SUMS[metric]
    tasks = rows["task"].long()
    sums = torch.zeros(2, num_tasks, dtype=torch.float64)
    sums[0].index_add_(0, tasks, rows[num].double())
    sums[1].index_add_(0, tasks, rows[den].double())
    return sums[0] / sums[1]


@dataclass
class Retention:
    """Retention in percent per task (NaN where undefined) and its mean over the defined tasks (ATR)."""

    per_task: dict[str, float]
    atr: float
    excluded: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"atr": self.atr, "per_task": self.per_task, "excluded": self.excluded}


def retention(scores: torch.Tensor, reference: torch.Tensor, task_names: Sequence[str]) -> Retention:
    """100 * scores / reference per task; ATR = their mean over tasks with a non-zero, defined reference."""
    if len(scores) != len(reference) or len(scores) != len(task_names):
        raise ValueError(f"scores ({len(scores)}), reference ({len(reference)}) and task names ({len(task_names)}) "
                         "must have one entry per task")
    per_task: dict[str, float] = {}
    excluded: list[str] = []
    for name, s, r in zip(task_names, scores.tolist(), reference.tolist()):
        if r != r or s != s or r == 0:  # NaN (no samples) or a zero reference: retention undefined
            per_task[name] = float("nan")
            excluded.append(name)
        else:
            per_task[name] = 100.0 * (s / r)  # exactly 100 when s == r
    defined = [v for v in per_task.values() if v == v]
    if not defined:
        raise ValueError(f"retention is undefined for every task {list(task_names)}: the reference scores "
                         f"{reference.tolist()} are all zero or missing")
    return Retention(per_task=per_task, atr=sum(defined) / len(defined), excluded=excluded)

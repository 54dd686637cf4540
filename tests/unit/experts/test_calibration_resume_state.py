"""A calibration resume state whose fields are well-formed but wrong is refused with one line naming the file and the
field: when it is read, before anything is built (a field missing or of another type, setup, fingerprint, layers,
experts, counts and how they agree), once the job's observer exists and before anything is loaded into it (the
statistics, layers and shapes the job collects, every token's top-k in ``frequency``), and when the batches are
checked (a ``batches_seen`` that disagrees with the digest of the batches it accumulated). The good state is written
by a tiny calibration, then one field is edited per case."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from fixtures import padded_batch

from lightprune.callbacks import ExpertStats
from lightprune.experts.calibration import ExpertObserver
from lightprune.experts.calibration.resume import (
    CalibrationStateError,
    chain_digest,
    check_batches,
    load_state,
    model_fingerprint,
    save_state,
)

SUBSETS, CRITERIA = ["all", "text"], ["frequency", "reap", "router_logits"]
FRESH = "delete it or set resume: false (ExpertStats(resume=False)) to start afresh"


def _batches(count: int = 4) -> list[dict[str, torch.Tensor]]:
    """2 x 9 tokens a batch, 3 of them padding: 15 tokens and 2 samples of each subset."""
    return [padded_batch(seed=s, max_id=90) for s in range(1, count + 1)]


@pytest.fixture(scope="module")
def good(tiny, tmp_path_factory):
    """(model, the callback, the state a tiny calibration of 2 batches saved) of qwen3_moe (MoE layers 0-2, 8 experts,
    top-2), with subsets all and text, the token sums and the router logits' Gram matrix (a merging group)."""
    model = tiny("qwen3_moe")
    callback = ExpertStats(subsets=SUBSETS, criteria=CRITERIA)
    observer = ExpertObserver(model, SUBSETS, CRITERIA)
    digest = None
    with observer, torch.no_grad():
        for batch in _batches(2):
            observer.begin_batch(batch)
            model(**batch)
            digest = chain_digest(digest, batch)
    path = tmp_path_factory.mktemp("good") / "calibration_state.rank0.pt"
    save_state(path, observer.state_dict(), callback._setup(), model_fingerprint(model), digest)
    return model, callback, torch.load(path, weights_only=True)


def _write(tmp_path, state) -> str:
    path = tmp_path / "calibration_state.rank0.pt"
    torch.save(state, path)
    return str(path)


def _refused(path: str, field: str, problem: str) -> str:
    return f"calibration state {path!r}: field {field} {problem}; {FRESH}"


class _Trainer:
    """What ExpertStats reads of a trainer: where its files go, the rank, whether it calibrates."""

    def __init__(self, root):
        self.default_root_dir, self.global_rank, self.calibrating = str(root), 0, True


def _edit(state, *path, value=None, delete=False):
    target = state
    for key in path[:-1]:
        target = target[key]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value(target[path[-1]]) if callable(value) else value
    return state


def _scaled(tensor, at, by):
    tensor = tensor.clone()
    tensor.view(-1)[at] += by
    return tensor


# (case, edit of the state, field, problem): refused when the file is read, before anything is built
READ_CASES = [
    ("no batches_seen", lambda s: _edit(s, "observer", "batches_seen", delete=True), "observer.batches_seen",
     "is missing"),
    ("negative batches_seen", lambda s: _edit(s, "observer", "batches_seen", value=-1), "observer.batches_seen",
     "is -1; a count cannot be negative"),
    ("float batches_seen", lambda s: _edit(s, "observer", "batches_seen", value=2.0), "observer.batches_seen",
     "is 2.0 (float); a count is a whole number (int)"),
    ("tensor batches_seen", lambda s: _edit(s, "observer", "batches_seen", value=torch.tensor(2)),
     "observer.batches_seen", "is tensor(2) (Tensor); a count is a whole number (int)"),
    ("no version", lambda s: _edit(s, "version", delete=True), "version", "is missing"),
    ("another version", lambda s: _edit(s, "version", value=2), "version",
     "is 2 (int); this lightprune reads version 1"),
    ("no criteria", lambda s: _edit(s, "setup", "criteria", delete=True), "setup.criteria", "is missing"),
    ("quantile a string", lambda s: _edit(s, "setup", "low_attn_quantile", value="0.02"), "setup.low_attn_quantile",
     "is '0.02' (str), not a float in (0, 0.5]"),
    ("no digest", lambda s: _edit(s, "digest", value=None), "digest",
     "is None (NoneType), not the SHA-256 hex digest of the first 2 batches"),
    ("zero experts", lambda s: _edit(s, "model", "experts_per_layer", "1", value=0), "model.experts_per_layer[1]",
     "is 0; an MoE layer has routed experts"),
    ("a NaN router sum", lambda s: _edit(s, "model", "router_sums", "2", value=float("nan")), "model.router_sums[2]",
     "is nan (float), not a finite float"),
    ("a layer twice", lambda s: _edit(s, "observer", "layers", "1", value=s["observer"]["layers"][1]),
     "observer.layers", "names layer 1 twice"),
    ("a layer not the model's", lambda s: _edit(s, "observer", "layers", 7, value=s["observer"]["layers"][2]),
     "observer.layers",
     "holds layers [0, 1, 2, 7], its model fingerprint (model.experts_per_layer) MoE layers [0, 1, 2]"),
    ("a merging layer missing", lambda s: _edit(s, "observer", "merging", 0, delete=True), "observer.merging",
     "holds layers [1, 2], its model fingerprint (model.experts_per_layer) MoE layers [0, 1, 2]"),
    ("an expert not the model's", lambda s: _edit(s, "observer", "layers", 1, "frequency",
                                                   value=lambda t: torch.cat([t, t[:, :1]], dim=1)),
     "observer.layers[1].frequency", ("has shape [2, 9], expected [2, 8] (one per subset of setup.subsets and routed "
                                     "expert)")),
    ("a subset not the job's", lambda s: _edit(s, "observer", "layers", 0, "tokens",
                                               value=lambda t: torch.cat([t, t[:1]])),
     "observer.layers[0].tokens", "has shape [3], expected [2] (one per subset of setup.subsets)"),
    ("negative tokens", lambda s: _edit(s, "observer", "layers", 2, "tokens", value=lambda t: -t),
     "observer.layers[2].tokens", "holds -30; a count cannot be negative"),
    ("fractional frequency", lambda s: _edit(s, "observer", "layers", 0, "frequency",
                                             value=lambda t: _scaled(t, 3, 0.5)),
     "observer.layers[0].frequency", "holds a fraction; it counts tokens or samples"),
    ("float32 sums", lambda s: _edit(s, "observer", "layers", 1, "reap_num", value=lambda t: t.float()),
     "observer.layers[1].reap_num", "is torch.float32; calibration sums are torch.float64"),
    ("a NaN sum", lambda s: _edit(s, "observer", "merging", 2, "router_logits",
                                  value=lambda t: _scaled(t, 0, float("nan"))),
     "observer.merging[2].router_logits", "holds NaN or inf; a sum of finite statistics is finite"),
    ("more samples than tokens", lambda s: _edit(s, "observer", "layers", 0, "samples",
                                                 value=lambda t: t + 40),
     "observer.layers[0].samples", ("is [44.0, 44.0], above the tokens counted (observer.layers[0].tokens "
                                   "[30.0, 30.0]): a sample counts once it has a token")),
    ("merging tokens beyond the subsets'", lambda s: _edit(s, "observer", "merging", 1, "tokens",
                                                           value=lambda t: t + 31),
     "observer.merging[1].tokens", ("is 61, but the subsets count [30.0, 30.0] tokens (observer.layers[1].tokens): "
                                   "it counts those in some subset")),
    ("no batch but a digest", lambda s: _edit(s, "observer", "batches_seen", value=0), "digest",
     "holds a digest, but observer.batches_seen is 0: no batch to digest"),
    ("no batch but sums", lambda s: _edit(_edit(s, "observer", "batches_seen", value=0), "digest", value=None),
     "observer.layers[0].tokens", "is not 0, but observer.batches_seen is 0: nothing was summed"),
    ("batches but no tokens", lambda s: _edit(s, "observer", "layers", 1, "tokens", value=torch.zeros_like),
     "observer.layers[1].samples", ("is [4.0, 4.0], above the tokens counted (observer.layers[1].tokens [0.0, 0.0]): a "
                                   "sample counts once it has a token")),
    ("batches but nothing counted", lambda s: _edit(_edit(s, "observer", "layers", 1, "tokens",
                                                          value=torch.zeros_like),
                                                    "observer", "layers", 1, "samples", value=torch.zeros_like),
     "observer.layers[1].tokens", "is all 0, but observer.batches_seen is 2: every batch seen counts its tokens"),
]


@pytest.mark.parametrize("case,edit,field,problem", READ_CASES, ids=[c[0] for c in READ_CASES])
def test_a_wrong_field_is_refused_when_the_state_is_read(good, tmp_path, case, edit, field, problem) -> None:
    _, callback, state = good
    path = _write(tmp_path, edit(copy.deepcopy(state)))
    with pytest.raises(CalibrationStateError) as info:
        load_state(path, callback._setup())
    assert str(info.value) == _refused(path, field, problem)
    # through the callback: refused before the trainer runs anything (no observer built)
    with pytest.raises(CalibrationStateError) as info:
        callback.batches_to_skip(_Trainer(tmp_path))
    assert str(info.value) == _refused(path, field, problem) and callback._observer is None


def test_a_subset_or_criteria_not_the_jobs_is_refused_naming_the_setup_field(good, tmp_path) -> None:
    _, callback, state = good
    path = _write(tmp_path, _edit(copy.deepcopy(state), "setup", "subsets", value=["all", "vision"]))
    with pytest.raises(CalibrationStateError) as info:
        load_state(path, callback._setup())
    assert str(info.value) == (f"calibration state {path!r} was made with another setup (subsets: saved ['all', "
                               f"'vision'], now ['all', 'text']); {FRESH}")


# (case, edit, field, problem): refused once the job's observer exists, before anything is loaded into it
JOB_CASES = [
    ("a statistic not the job's", lambda s: _edit(s, "observer", "layers", 0, "delta_h",
                                                  value=torch.zeros(2, 8, dtype=torch.float64)),
     "observer.layers[0].delta_h", ("is not a statistic of this job (this job collects ['frequency', 'reap', "
                                   "'router_logits'])")),
    ("a sum missing", lambda s: _edit(s, "observer", "layers", 1, "reap_num", delete=True),
     "observer.layers[1].reap_num", "is missing"),
    ("a group missing", lambda s: _edit(s, "observer", "merging", delete=True), "observer.merging",
     "is missing (this job collects ['frequency', 'reap', 'router_logits'])"),
    ("a shape not the job's", lambda s: _edit(s, "observer", "layers", 2, "ean", value=lambda t: t[:, :7]),
     "observer.layers[2].ean", "has shape [2, 7], this job's is [2, 8] (2 subsets, 8 experts)"),
    ("tokens that disagree with the routed counts", lambda s: _edit(s, "observer", "layers", 1, "tokens",
                                                                    value=lambda t: _scaled(t, 1, -2)),
     "observer.layers[1].frequency", ("sums to [60.0, 60.0] routed tokens per subset, but observer.layers[1].tokens "
                                     "[30.0, 28.0] times top_k 2 is [60.0, 56.0]: the counts disagree with the sums")),
    ("a routed count changed", lambda s: _edit(s, "observer", "layers", 0, "frequency",
                                               value=lambda t: _scaled(t, 5, 1)),
     "observer.layers[0].frequency", ("sums to [61.0, 60.0] routed tokens per subset, but observer.layers[0].tokens "
                                     "[30.0, 30.0] times top_k 2 is [60.0, 60.0]: the counts disagree with the sums")),
]


@pytest.mark.parametrize("case,edit,field,problem", JOB_CASES, ids=[c[0] for c in JOB_CASES])
def test_a_state_that_is_not_what_the_job_collects_is_refused_before_it_is_loaded(good, tmp_path, monkeypatch, case,
                                                                                  edit, field, problem) -> None:
    model, callback, state = good
    path = _write(tmp_path, edit(copy.deepcopy(state)))
    trainer = _Trainer(tmp_path)
    callback = copy.copy(callback)
    callback._resumed = callback._pending_state = None
    assert callback.batches_to_skip(trainer) == 2  # read and well-formed
    loads, entered = [], []
    monkeypatch.setattr(ExpertObserver, "load_state_dict", lambda self, saved: loads.append(saved))
    monkeypatch.setattr(ExpertObserver, "__enter__", lambda self: entered.append(self))
    with pytest.raises(CalibrationStateError) as info:
        callback.on_validation_start(trainer, SimpleNamespace(model=model))
    assert str(info.value) == _refused(path, field, problem)
    assert loads == [] and entered == [] and callback._observer is None  # nothing loaded, the model not observed


def test_the_good_state_resumes(good, tmp_path) -> None:
    """The checks refuse nothing of a state as written: it loads into the job's observer, whose state is then the
    saved one."""
    model, callback, state = good
    _write(tmp_path, copy.deepcopy(state))
    callback = copy.copy(callback)
    callback._resumed = callback._pending_state = None
    trainer = _Trainer(tmp_path)
    assert callback.batches_to_skip(trainer) == 2
    callback.check_resume(trainer, iter(_batches()))
    callback.on_validation_start(trainer, SimpleNamespace(model=model))
    try:
        assert callback._observer.batches_seen == 2
        torch.testing.assert_close(callback._observer.state_dict(), state["observer"], rtol=0, atol=0)
    finally:
        callback.teardown(trainer, SimpleNamespace(model=model), "validate")


@pytest.mark.parametrize("count,data,found", [(1, 4, 2), (3, 4, 2), (3, 2, 2)])
def test_a_batches_seen_that_disagrees_with_the_digest_is_refused_naming_it(good, tmp_path, count, data,
                                                                           found) -> None:
    """batches_seen edited from 2 to ``count``, the run's data ``data`` batches: the state's digest is that of the
    first 2 batches, so the count, not the data, is what changed."""
    _, callback, state = good
    state = _edit(copy.deepcopy(state), "observer", "batches_seen", value=count)
    path = _write(tmp_path, state)
    with pytest.raises(CalibrationStateError) as info:
        check_batches(path, load_state(path, callback._setup()), _batches(data))
    assert str(info.value) == _refused(path, "observer.batches_seen", f"is {count}, but the state's digest is that of "
                                       f"this run's first {found} calibration batches: the count disagrees with the "
                                       "batches accumulated")


def test_other_data_is_still_refused_as_other_data(good, tmp_path) -> None:
    _, callback, state = good
    path = _write(tmp_path, copy.deepcopy(state))
    other = [padded_batch(seed=s, max_id=90) for s in (7, 8, 9)]
    with pytest.raises(CalibrationStateError, match=r"this run's first 2 calibration batches differ from the ones it "
                                                    r"accumulated"):
        check_batches(path, load_state(path, callback._setup()), other)

"""Width scorers (MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), section 3 and
appendices A.1 and A.4): the registry, the built-ins against the functions they stand for (bitwise), a user-defined
scorer driving WidthSearch's scores, and the project-local example in callbacks/ against its formula computed by
hand."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch
from fixtures import REPO
from fixtures.width import dense_lm, lm_batch, random_keep

from lightprune.callbacks.width_search import WidthSearch
from lightprune.testing.batches import tiny_multimodal_batch
from lightprune.width.min_rank import min_rank_scores
from lightprune.width.paths import MODALITIES, PATHS
from lightprune.width.plan import WidthPlan
from lightprune.width.scorer import BATCHES, PER_TASK, WidthScorer, category_batches
from lightprune.width.scorers import (
    MinRankScorer,
    RandomScorer,
    TaylorScorer,
    available_width_scorers,
    get_width_scorer,
    get_width_scorer_class,
    register_width_scorer,
    unregister_width_scorer,
)
from lightprune.width.select import random_scores
from lightprune.width.taylor import WidthScores, taylor_importance


def _labelled(batch, answer=2):
    """labels = each sample's last ``answer`` real tokens, -100 elsewhere."""
    labels = torch.full_like(batch["input_ids"], -100)
    for b, row in enumerate(batch["attention_mask"]):
        last = int(row.nonzero().max())
        labels[b, last - answer + 1:last + 1] = batch["input_ids"][b, last - answer + 1:last + 1]
    return {**batch, "labels": labels}


def _equal(a: WidthScores, b: WidthScores) -> bool:
    """Bitwise: the same layers, the same float64 values, the same sample count."""
    return (a.num_samples == b.num_samples and sorted(a.attn) == sorted(b.attn) and sorted(a.ffn) == sorted(b.ffn)
            and all(x.dtype == torch.float64 and torch.equal(x, b.attn[l]) for l, x in a.attn.items())
            and all(torch.equal(a.ffn[l][mu], b.ffn[l][mu]) for l in a.ffn for mu in MODALITIES))


@pytest.fixture
def scorer_names():
    """Leaves the registry as it found it (a test's own scorers removed, a replaced entry restored)."""
    before = {name: get_width_scorer_class(name) for name in available_width_scorers()}
    yield before
    for name in available_width_scorers():
        if name not in before or get_width_scorer_class(name) is not before[name]:
            unregister_width_scorer(name)
    for name, cls in before.items():
        if name not in available_width_scorers():
            register_width_scorer(name)(cls)


# ---------------------------------------------------------------------------------------------- built-ins
def test_taylor_scorer_is_taylor_importance_bitwise(tiny):
    model = tiny("qwen2_5_vl")
    batches = [_labelled(tiny_multimodal_batch(model, batch_size=2, images_per_sample=1, seed=s, pad_last=2))
               for s in (1, 2)]
    scorer = get_width_scorer("taylor")
    assert isinstance(scorer, TaylorScorer) and scorer.calibration == BATCHES and repr(scorer) == "TaylorScorer()"
    attn = scorer.score(model, batches, attention=True, progress=False)
    assert _equal(attn, taylor_importance(model, batches, attention=True, progress=False)) and attn.ffn == {}
    plan = WidthPlan.dense(model).replace(attn_keep=random_keep(WidthPlan.dense(model), [0, 1, 2], seed=5))
    ffn = scorer.score(model, batches, attention=False, ffn=True, plan=plan, progress=False)
    assert _equal(ffn, taylor_importance(model, batches, attention=False, ffn=True, plan=plan, progress=False))
    assert ffn.attn == {} and ffn.num_samples == 4 and (ffn.ffn[0]["vision"] > 0).any()
    with pytest.raises(ValueError, match="'taylor' reads one calibration set: an iterable of batches, got dict"):
        scorer.score(model, {"a": batches})
    with pytest.raises(ValueError, match="'taylor': attention=False and ffn=False leave nothing to score"):
        scorer.score(model, batches, attention=False)


def test_random_scorer_is_random_scores_for_its_seed():
    model = dense_lm()
    attn, ffn = random_scores(WidthPlan.dense(model), seed=7)
    scorer = get_width_scorer("random", seed=7)
    assert scorer.hparams == {"seed": 7} and repr(scorer) == "RandomScorer(seed=7)"
    both = scorer.score(model, attention=True, ffn=True)
    assert _equal(both, WidthScores(attn, ffn, 0))
    # the same values whichever part is asked for
    assert _equal(scorer.score(model, attention=True), WidthScores(attn, {}, 0))
    assert _equal(RandomScorer(seed=7).score(model, attention=False, ffn=True), WidthScores({}, ffn, 0))
    other = RandomScorer(seed=8).score(model, attention=True)
    assert not torch.equal(other.attn[0], attn[0])
    with pytest.raises(TypeError, match=r"seed must be an int, got '7' \(str\)"):
        RandomScorer(seed="7")
    with pytest.raises(TypeError, match="seed must be an int, got True"):
        RandomScorer(seed=True)
    with pytest.raises(ValueError, match="'random' reads no calibration data; got batches \\(list\\)"):
        scorer.score(model, [lm_batch()])


def test_min_rank_scorer_is_min_rank_of_per_task_taylor():
    model = dense_lm()
    batch = _labelled(lm_batch())
    tasks = {"first": [{k: v[:2] for k, v in batch.items()}], "second": [{k: v[2:] for k, v in batch.items()}]}
    scorer = get_width_scorer("min_rank")
    assert isinstance(scorer, MinRankScorer) and scorer.calibration == PER_TASK
    got = scorer.score(model, tasks, attention=True, ffn=True, progress=False)
    per_task = [taylor_importance(model, b, attention=True, ffn=True, progress=False) for b in tasks.values()]
    assert _equal(got, min_rank_scores(per_task)) and got.num_samples == 3
    # the categories disagree, so the combination differs from either category's own order
    assert not torch.equal(got.attn[0].argsort(0), per_task[0].attn[0].argsort(0))
    with pytest.raises(ValueError, match=r"one calibration set per task category: a non-empty mapping"):
        scorer.score(model, [batch])
    with pytest.raises(ValueError, match=r"one calibration set per task category: a non-empty mapping"):
        scorer.score(model, {})


class _TaskData:
    task_names = ("a", "b", "c")

    def __init__(self):
        self.asked = []

    def dataloader(self, split, tasks=None):
        self.asked.append((split, tuple(tasks)))
        return [] if tasks == ["b"] else [f"{split}-{tasks[0]}"]


def test_category_batches_serves_one_set_per_task_and_leaves_out_empty_ones():
    dm = _TaskData()
    assert category_batches(dm) == {"a": ["calibration-a"], "c": ["calibration-c"]}
    assert dm.asked == [("calibration", ("a",)), ("calibration", ("b",)), ("calibration", ("c",))]

    class NoTasks:
        task_names = None

        def dataloader(self, split, tasks=None):
            return []

    with pytest.raises(ValueError, match="NoTasks has no task_names"):
        category_batches(NoTasks())
    with pytest.raises(ValueError, match=r"object has no dataloader\(split, tasks=\[name\]\)"):
        category_batches(object())


# ---------------------------------------------------------------------------------------------- registry
def test_registry_refuses_duplicates_unknown_names_and_wrong_classes(scorer_names):
    assert {"taylor", "min_rank", "random"} <= set(available_width_scorers())

    @register_width_scorer("test_ones")
    class Ones(WidthScorer):
        def score_heads(self, layer):
            return torch.ones(layer.num_heads)

    assert Ones.name == "test_ones" and get_width_scorer_class("test_ones") is Ones
    register_width_scorer("test_ones")(Ones)  # the same class again: allowed
    with pytest.raises(ValueError, match=r"'test_ones' is already registered to .*Ones; choose another name"):
        register_width_scorer("test_ones")(type("Ones", (WidthScorer,), {}))
    with pytest.raises(ValueError, match=r"'taylor' is already registered to lightprune.width.scorers.TaylorScorer"):
        register_width_scorer("taylor")(Ones)
    with pytest.raises(ValueError, match=r"unknown width scorer 'nope'; available: (.*, )?min_rank, random, "
                                         r"taylor, (.*, )?test_ones"):
        get_width_scorer("nope")
    with pytest.raises(ValueError, match="unknown width scorer 'nope'; available: .*min_rank"):
        WidthSearch(criterion="nope")
    with pytest.raises(ValueError, match="width scorer name must be .*, got 'Bad-Name'"):
        register_width_scorer("Bad-Name")
    with pytest.raises(TypeError, match="must be a WidthScorer subclass"):
        register_width_scorer("test_plain")(object)
    with pytest.raises(TypeError, match="'random': .*unexpected keyword argument 'sed'; its arguments are: seed"):
        get_width_scorer("random", sed=1)
    with pytest.raises(ValueError, match=r"got arguments \['seed'\] for an already built width scorer"):
        get_width_scorer(RandomScorer(), seed=1)
    assert get_width_scorer("lightprune.width.scorers.RandomScorer", seed=2).seed == 2
    with pytest.raises(ValueError, match="cannot import width scorer 'lightprune.width.scorers.Nope'"):
        get_width_scorer("lightprune.width.scorers.Nope")
    with pytest.raises(TypeError, match="registered name, a dotted import path"):
        get_width_scorer(3)
    assert unregister_width_scorer("test_ones") is Ones and "test_ones" not in available_width_scorers()


def test_scores_are_checked_against_the_model(scorer_names):
    model = dense_lm()

    class WrongShape(WidthScorer):
        def score_heads(self, layer):
            return torch.ones(layer.num_heads + 1)

    class NotFinite(WidthScorer):
        def score_heads(self, layer):
            return torch.full((layer.num_heads, 3), float("nan"))

    class MissesLayers(WidthScorer):
        calibration = BATCHES

        def compute(self, model, batches, *, attention, ffn, plan, progress):
            return WidthScores({0: torch.ones(4, 3, dtype=torch.float64)}, {}, 1)

    with pytest.raises(ValueError, match=r"'WrongShape': score_heads of layer 0 have shape \(5,\), expected \(4, 3\)"):
        WrongShape().score(model)
    with pytest.raises(ValueError, match="'NotFinite': score_heads of layer 0 are not finite"):
        NotFinite().score(model)
    with pytest.raises(ValueError, match=r"scored attention layers \[0\] and FFN layers \[\]; expected \[0, 1\]"):
        MissesLayers().score(model, [])
    with pytest.raises(NotImplementedError, match="must implement score_channels"):
        WrongShape().score(model, attention=False, ffn=True)


# ---------------------------------------------------------------------------------------------- WidthSearch
class _Trainer:
    def __init__(self, datamodule):
        self.datamodule = datamodule


class _Module:
    def __init__(self, model):
        self.model = model


class _SearchData:
    task_names = ("a", "b")

    def __init__(self, batch):
        self.calibration = [batch]

    def calibration_dataloader(self):
        return self.calibration

    def dataloader(self, split, tasks=None):
        return [(split, tasks[0])]


def test_width_search_scores_with_a_user_scorer(scorer_names):
    model = dense_lm()
    seen = []

    @register_width_scorer("test_planted")
    class Planted(WidthScorer):
        """Attention: head h of layer l scores 10 l + h, equal paths; FFN: the channel index (reads data)."""

        calibration = BATCHES

        def compute(self, model, batches, *, attention, ffn, plan, progress):
            seen.append((batches, attention, ffn, plan))
            attn = {l: (10.0 * l + torch.arange(4, dtype=torch.float64))[:, None].repeat(1, 3) for l in (0, 1)}
            ffn_scores = {l: {mu: torch.arange(24, dtype=torch.float64) for mu in MODALITIES} for l in (0, 1)}
            return WidthScores(attn if attention else {}, ffn_scores if ffn else {}, 1)

    search = WidthSearch(criterion="test_planted", progress=False)
    assert isinstance(search.criterion, Planted)
    search._m0 = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    data = _SearchData(_labelled(lm_batch()))
    trainer, module = _Trainer(data), _Module(model)
    search._attn_scores = search._score(trainer, module, attention=True, plan=None).attn
    assert seen[-1][:3] == (data.calibration, True, False)
    assert torch.equal(search._attn_scores[1][:, 0], torch.tensor([10.0, 11.0, 12.0, 13.0], dtype=torch.float64))
    # the stage's candidate prunes the planted lowest: layer 0's heads 0..2 (ratio 3/8 of 8 units)
    plan = search._plan_for(module, "v2v", 3 / 8)
    assert plan.attn_keep[0][:, 0].tolist() == [False, False, False, True] and plan.attn_keep[1][:, 0].all()
    ffn = search._score(trainer, module, attention=False, plan=plan)
    assert seen[-1][1:] == (False, True, plan) and torch.equal(ffn.ffn[0]["text"], torch.arange(24).double())
    # a per-task scorer gets one calibration set per task; a calibration-free one gets none
    seen.clear()
    search = WidthSearch(criterion=type("PerTask", (Planted,), {"calibration": PER_TASK})())
    search._m0 = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    search._score(trainer, module, attention=True, plan=None)
    assert seen[-1][0] == {"a": [("calibration", "a")], "b": [("calibration", "b")]}
    search = WidthSearch(criterion=RandomScorer(seed=3))
    search._m0 = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    drawn = search._score(trainer, module, attention=True, plan=None)
    assert _equal(drawn, WidthScores(random_scores(WidthPlan.dense(model), 3)[0], {}, 0))


def test_width_search_state_dict_round_trips_with_its_criterion():
    search = WidthSearch(criterion=RandomScorer(seed=2), progress=False)
    search._reference, search._current = [0.5, 0.25], 0.3
    state = search.state_dict()
    assert state["criterion"] == "RandomScorer(seed=2)"
    again = WidthSearch(criterion="lightprune.width.scorers.RandomScorer", progress=False)
    with pytest.raises(ValueError, match=r"scored with RandomScorer\(seed=2\), this WidthSearch with "
                                         r"RandomScorer\(seed=0\); resume with the same criterion"):
        again.load_state_dict(state)
    same = WidthSearch(criterion=get_width_scorer("random", seed=2), progress=False)
    same.load_state_dict(state)
    assert same.state_dict() == state
    old = {k: v for k, v in WidthSearch().state_dict().items() if k != "criterion"}  # before the argument
    WidthSearch().load_state_dict(old)
    with pytest.raises(ValueError, match=r"scored with TaylorScorer\(\)"):
        WidthSearch(criterion="random").load_state_dict(old)


def test_width_search_needs_per_task_data_for_a_per_task_scorer():
    class NoTaskSplits:
        task_names = ("a",)

    search = WidthSearch(criterion="min_rank")
    with pytest.raises(ValueError, match="'min_rank' reads one calibration set per task category, but NoTaskSplits "
                                         r"has no dataloader\(split, tasks=\[name\]\)"):
        search.setup(_Trainer(NoTaskSplits()), None, "fit")


# ---------------------------------------------------------------------------------------------- the example
@pytest.fixture
def example(scorer_names, monkeypatch):
    """callbacks/weight_norm_width.py imported afresh (a README block may hold its name: set aside meanwhile)."""
    monkeypatch.syspath_prepend(str(REPO))
    if "weight_norm_width" in available_width_scorers():
        unregister_width_scorer("weight_norm_width")
    sys.modules.pop("callbacks.weight_norm_width", None)
    yield importlib.import_module("callbacks.weight_norm_width")
    sys.modules.pop("callbacks.weight_norm_width", None)


def test_example_scorer_gives_its_formula(example, tiny):
    model = tiny("llava_onevision")
    by_name = get_width_scorer("weight_norm_width")
    by_path = get_width_scorer("callbacks.weight_norm_width.WeightNormWidth")
    assert type(by_name) is type(by_path) is example.WeightNormWidth and by_name.calibration == "none"
    scores = by_path.score(model, attention=True, ffn=True)
    layers = model.model.language_model.layers
    assert sorted(scores.attn) == sorted(scores.ffn) == list(range(len(layers)))
    for l, layer in enumerate(layers):
        heads = model.config.text_config.num_attention_heads
        o = layer.self_attn.o_proj.weight.detach()
        head_dim = o.shape[1] // heads
        for h in range(heads):
            block = o[:, h * head_dim:(h + 1) * head_dim]
            want = sum(float(x) ** 2 for x in block.flatten()) ** 0.5
            assert scores.attn[l][h].tolist() == pytest.approx([want] * len(PATHS), rel=1e-12)
        down = layer.mlp.down_proj.weight.detach()
        want = [sum(float(x) ** 2 for x in down[:, c]) ** 0.5 for c in range(down.shape[1])]
        for mu in MODALITIES:
            assert scores.ffn[l][mu].tolist() == pytest.approx(want, rel=1e-12)

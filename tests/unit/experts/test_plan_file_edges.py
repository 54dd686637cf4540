"""Plan files at their edges: NaN and Infinity (valid to Python's json, not JSON) refused by every plan loader naming
the file and the key; a directory named as a plan file; a plan naming 100,000 layers refused in one short line; a plan
made for another model said to be one."""

from __future__ import annotations

import json
import math
import re

import pytest

import lightprune as lp
from fixtures import PLAN_EXPERT as EXPERT
from fixtures import PLAN_MERGE as MERGE
from fixtures import PLAN_WIDTH as WIDTH
from lightprune.core.errors import PlanError
from lightprune.experts.merging import MergePlan
from lightprune.testing.tiny import tiny_model
from lightprune.width.plan import WidthPlan

LOADERS = {"plan": (lp.ExpertPlan, EXPERT), "merge plan": (MergePlan, MERGE), "width plan": (WidthPlan, WIDTH)}


def _with(data: dict, path: tuple, value) -> dict:
    data = json.loads(json.dumps(data))
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return data


@pytest.mark.parametrize("kind", LOADERS)
@pytest.mark.parametrize("path, value, shown", [
    (("metadata", "score_floor"), -math.inf, "-Infinity"),
    (("metadata", "alpha", "a"), math.nan, "NaN"),
    (("metadata", "list"), [1.0, math.inf], "Infinity"),
])
def test_nan_and_infinity_anywhere_in_a_plan_file_are_refused_naming_file_and_key(tmp_path, kind, path, value,
                                                                                   shown) -> None:
    cls, good = LOADERS[kind]
    file = tmp_path / "plan.json"
    file.write_text(json.dumps(_with(good, path, value)))  # Python writes NaN / Infinity: not JSON
    key = "metadata" + "".join(f"[{k!r}]" for k in path[1:]) + ("[1]" if isinstance(value, list) else "")
    with pytest.raises(PlanError, match="^" + re.escape(f"{kind} file {str(file)!r}: {key} is {shown}: a {kind} "
                                                        "holds finite numbers only")):
        cls.load(file)
    file.write_text(json.dumps(good))
    cls.load(file)  # the same plan without the constant loads


def test_a_nan_ratio_or_expert_id_is_named_too(tmp_path) -> None:
    for field, value, key in (("ratio", math.nan, "ratio"),
                              ("keep", {"0": [0, math.nan], "1": [1, 2]}, "keep['0'][1]")):
        file = tmp_path / f"{field}.json"
        file.write_text(json.dumps({**EXPERT, field: value}))
        with pytest.raises(PlanError, match=re.escape(f"{str(file)!r}: {key} is NaN")):
            lp.ExpertPlan.load(file)


def test_a_plan_built_in_python_holds_no_nan_either() -> None:
    with pytest.raises(PlanError, match=r"^metadata\['floor'\] is -Infinity: a plan holds finite numbers only"):
        lp.ExpertPlan(keep={0: [0]}, num_experts={0: 2}, metadata={"floor": -math.inf})
    with pytest.raises(PlanError, match=r"^metadata\['x'\]\[0\] is NaN: a width plan holds finite numbers only"):
        WidthPlan(attn_keep={}, ffn_keep={}, num_heads={0: 1}, intermediate_size={}, metadata={"x": [math.nan]})


@pytest.mark.parametrize("kind", LOADERS)
def test_a_directory_named_as_a_plan_file_is_said_to_be_one(tmp_path, kind) -> None:
    cls, _ = LOADERS[kind]
    with pytest.raises(IsADirectoryError, match=re.escape(f"{kind} file {str(tmp_path)!r} is a directory, not a file")):
        cls.load(tmp_path)


def test_a_plan_file_under_home_is_read_with_tilde(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "plan.json").write_text(json.dumps(EXPERT))
    assert lp.ExpertPlan.load("~/plan.json").keep == {0: [0, 1], 1: [1, 2]}


def _short(err: BaseException) -> str:
    text = str(err)
    assert len(text) < 600 and "\n" not in text, text[:300]
    return text


@pytest.mark.exhaustive
def test_a_plan_naming_100000_layers_is_refused_in_one_short_line(tmp_path) -> None:
    model = tiny_model("qwen3_moe")  # MoE layers 0, 1, 2 of 8 experts
    n = 100_000
    file = tmp_path / "huge.json"
    file.write_text(json.dumps({"keep": {str(i): [0, 1, 2, 3] for i in range(n)},
                                "num_experts": {str(i): 8 for i in range(n)}}))
    with pytest.raises(PlanError) as info:
        lp.export_pruned(model, lp.ExpertPlan.load(file), tmp_path / "out")
    text = _short(info.value)
    assert f"It names {n:,} layers [0, 1, 2, 3, 4, 5, 6, 7, ... and {n - 8:,} more] (8 experts each)" in text
    assert f"plan names layers [3, 4, 5, 6, 7, 8, 9, 10, ... and {n - 11:,} more] that are not MoE layers" in text
    assert not (tmp_path / "out").exists()


def test_lists_in_other_plan_errors_are_capped(tmp_path) -> None:
    ids = list(range(50_000))
    with pytest.raises(PlanError) as info:
        lp.ExpertPlan(keep={0: ids + ids}, num_experts={0: 50_000})
    assert _short(info.value).startswith("plan layer 0 keeps duplicate expert ids [0, 1, 2, 3, 4, 5, 6, 7, ... and "
                                         "49,992 more]")
    with pytest.raises(PlanError) as info:
        lp.ExpertPlan.from_dict({**EXPERT, **{f"extra{i}": 1 for i in range(10_000)}})
    assert "and 9,992 more]" in _short(info.value)
    with pytest.raises(PlanError) as info:
        WidthPlan(attn_keep={}, ffn_keep={}, num_heads={i: 1 for i in range(20_000)}, intermediate_size={}).validate(
            tiny_model("qwen3_moe"))
    assert "and 19,992 more]" in _short(info.value)


def test_a_plan_of_another_model_is_said_to_be_one() -> None:
    qwen = tiny_model("qwen3_moe")  # MoE layers 0, 1, 2
    deepseek_plan = lp.ExpertPlan(keep={1: [2, 3, 4, 6], 2: [0, 1, 6, 7]}, num_experts={1: 8, 2: 8})
    with pytest.raises(PlanError) as info:
        lp.prune_experts(qwen, deepseek_plan)
    assert str(info.value) == ("plan leaves out MoE layers [0] of this model, whose MoE layers are 3 layers [0, 1, "
                               "2] (8 experts each); the plan names 2 layers [1, 2] (8 experts each): a plan made for "
                               "another model, or, to leave a layer unpruned, keep all its experts "
                               "(plan.completed(lp.find_moe_layers(model)) does so for every layer left out)")
    with pytest.raises(PlanError) as info:  # a layer this model does not have
        lp.prune_experts(qwen, lp.ExpertPlan(keep={2: [0, 1], 5: [0, 1]}, num_experts={2: 8, 5: 8}))
    assert str(info.value) == ("plan made for another model? It names 2 layers [2, 5] (8 experts each), this model "
                               "has MoE 3 layers [0, 1, 2] (8 experts each): plan names layers [5] that are not MoE "
                               "layers of this model")

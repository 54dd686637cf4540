"""The strict plan schema: a bad plan.json (a valid plan's ``to_dict()`` with one field damaged) is one
PlanError naming the file, the key path and the value; nothing is coerced (1.7 -> 1, "0123" -> [0, 1, 2, 3],
true -> 1, 8.9 -> 8); a valid plan round-trips exactly and saves the same bytes as before."""

from __future__ import annotations

import json
import re

import pytest
import torch

from lightprune.core.errors import PlanError
from lightprune.experts.plan import ExpertPlan
from lightprune.width.plan import PATHS, WidthPlan


def _plan() -> ExpertPlan:
    return ExpertPlan(keep={2: [5, 0, 1], 0: [3, 1]}, num_experts={0: 4, 2: 8}, criterion="reap", ratio=0.4,
                      allocation="global", metadata={"normalize": None, "pruned": 6})


def _width() -> dict:
    return {"paths": list(PATHS), "attn_keep": {"0": [[1, 0, 1], [0, 1, 1]], "1": [[1, 1, 1], [1, 0, 0]]},
            "ffn_keep": {"1": {"vision": [1, 0, 0, 1], "text": [1, 1, 1, 0]}},
            "num_heads": {"0": 2, "1": 2}, "intermediate_size": {"1": 4}, "metadata": {"method": "mwop"}}


def _set(*path):
    """A damage: ``d[path[0]]...[path[-2]] = path[-1]`` on a plan's dict."""
    *keys, last, value = path

    def damage(d):
        for key in keys:
            d = d[key]
        d[last] = value
    return damage


EXPERT_CASES = {  # id: (damage, what the message says after the file part)
    "keep [0, 1.7]": (_set("keep", "2", [0, 1.7]), r"keep\['2'\]\[1\] must be an expert id \(an integer\), got 1\.7"),
    "keep '0123'": (_set("keep", "0", "0123"), r"keep\['0'\] must be a list of expert ids, got \"0123\""),
    "keep [true, 1]": (_set("keep", "0", [True, 1]), r"keep\['0'\]\[0\] must be an expert id \(an integer\), got true"),
    "keep [0, 2.0]": (_set("keep", "0", [0, 2.0]), r"keep\['0'\]\[1\] must be an expert id \(an integer\), got 2\.0"),
    "keep ['1']": (_set("keep", "0", ["1"]), r"keep\['0'\]\[0\] must be an expert id \(an integer\), got \"1\""),
    "num_experts 8.9": (_set("num_experts", "2", 8.9), r"num_experts\['2'\] must be a positive integer .*, got 8\.9"),
    "num_experts 0": (_set("num_experts", "0", 0), r"num_experts\['0'\] must be a positive integer .*, got 0$"),
    "num_experts true": (_set("num_experts", "0", True), r"num_experts\['0'\] must be a positive integer .*, got true"),
    "keep null": (_set("keep", None), r"keep must be an object \{layer: \[expert ids\]\}, got null"),
    "num_experts list": (_set("num_experts", [4, 8]), r"num_experts must be an object .*, got \[4, 8\]"),
    "layer key 'a'": (_set("keep", "a", [0]), r"layer key 'a' in keep is not an integer"),
    "layer key '1.5'": (_set("num_experts", "1.5", 4), r"layer key '1\.5' in num_experts is not an integer"),
    "layer key '02'": (_set("keep", "02", [0]), r"layer key '02' in keep is not an integer \(write it as '2'\)"),
    "ratio 1.0": (_set("ratio", 1.0), r"ratio must be a number in \[0, 1\) or null, got 1\.0"),
    "ratio '0.5'": (_set("ratio", "0.5"), r"ratio must be a number in \[0, 1\) or null, got \"0\.5\""),
    "ratio true": (_set("ratio", True), r"ratio must be a number in \[0, 1\) or null, got true"),
    "criterion 3": (_set("criterion", 3), r"criterion must be a string, got 3"),
    "allocation null": (_set("allocation", None), r"allocation must be a string, got null"),
    "metadata []": (_set("metadata", []), r"metadata must be an object, got \[\]"),
    "unknown key": (_set("budget", 3), r"unknown plan keys \['budget'\]"),
    "not an object": (None, r"plan must be an object .*, got \[1, 2\]"),
}


@pytest.mark.parametrize("damage,message", EXPERT_CASES.values(), ids=EXPERT_CASES.keys())
def test_bad_expert_plan_file_names_file_key_and_value(tmp_path, damage, message):
    data = _plan().to_dict()
    if damage is None:
        data = [1, 2]
    else:
        damage(data)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="^" + re.escape(f"plan file {str(path)!r}: ") + message):
        ExpertPlan.load(path)
    if damage is not None:  # the same message, without the file part, from a dict built in Python
        with pytest.raises(PlanError, match="^" + message):
            ExpertPlan.from_dict(data)


@pytest.mark.parametrize("keep,num,message", [
    ({0: [0, 1.7]}, {0: 8}, r"^keep\[0\]\[1\] must be an expert id \(an integer\), got 1\.7$"),
    ({0: (0, True)}, {0: 8}, r"^keep\[0\]\[1\] must be an expert id \(an integer\), got true$"),
    ({0: {0, 1}}, {0: 8}, r"^keep\[0\] must be a list of expert ids, got \{0, 1\}$"),
    ({0: [0]}, {0: 8.0}, r"^num_experts\[0\] must be a positive integer .*, got 8\.0$"),
    ({1: [0], "1": [1]}, {1: 8}, r"^keep names layer 1 twice \(keys 1 and '1'\)$"),
    ({1.0: [0]}, {1: 8}, r"^layer key 1\.0 in keep is not an integer$"),
])
def test_bad_expert_plan_built_in_python(keep, num, message):
    with pytest.raises(PlanError, match=message):
        ExpertPlan(keep=keep, num_experts=num)


def test_valid_plan_round_trips_and_saves_the_same_bytes(tmp_path):
    plan = _plan()
    expected = {"keep": {"0": [1, 3], "2": [0, 1, 5]}, "num_experts": {"0": 4, "2": 8}, "criterion": "reap",
                "ratio": 0.4, "allocation": "global", "metadata": {"normalize": None, "pruned": 6}}
    assert plan.to_dict() == expected
    again = ExpertPlan.from_dict(plan.to_dict())
    assert again == plan and again.keep == {0: [1, 3], 2: [0, 1, 5]} and again.num_experts == {0: 4, 2: 8}
    assert all(type(k) is int for k in again.keep) and all(type(e) is int for ids in again.keep.values() for e in ids)
    path = plan.save(tmp_path / "plan.json")
    assert path.read_bytes() == (json.dumps(expected, indent=2, default=str) + "\n").encode()
    loaded = ExpertPlan.load(path)
    assert loaded == plan and loaded.to_dict() == expected
    assert ExpertPlan.from_dict({"keep": {}, "num_experts": {}, "ratio": 0}).ratio == 0  # 0 is a number in [0, 1)


@pytest.mark.parametrize("load", [ExpertPlan.load, WidthPlan.load], ids=["plan", "width plan"])
def test_a_file_that_is_not_utf8_is_a_plan_error_naming_it(tmp_path, load):
    path = tmp_path / "plan.json"
    path.write_bytes(b"\xff\xfe{\x00}\x00")
    what = "plan" if load == ExpertPlan.load else "width plan"
    with pytest.raises(PlanError, match="^" + re.escape(f"{what} file {str(path)!r} is not UTF-8 text: ")):
        load(path)


WIDTH_CASES = {
    "attn 0.0": (_set("attn_keep", "0", 1, [0, 1, 0.0]),
                 r"attn_keep\['0'\]\[1\]\[2\] must be a keep flag \(booleans or 0/1\), got 0\.0"),
    "attn '1'": (_set("attn_keep", "1", 0, [1, "1", 1]),
                 r"attn_keep\['1'\]\[0\]\[1\] must be a keep flag \(booleans or 0/1\), got \"1\""),
    "ffn 2": (_set("ffn_keep", "1", "text", [1, 2, 1, 0]),
              r"ffn_keep\['1'\]\['text'\]\[1\] must be a keep flag \(booleans or 0/1\), got 2"),
    "attn null": (_set("attn_keep", "0", None), r"attn_keep\['0'\] must be a list of keep flags .*, got null"),
    "ffn_keep null": (_set("ffn_keep", None), r"ffn_keep must be an object .*, got null"),
    "num_heads 2.0": (_set("num_heads", "0", 2.0), r"num_heads\['0'\] must be a positive integer .*, got 2\.0"),
    "intermediate_size true": (_set("intermediate_size", "1", True),
                               r"intermediate_size\['1'\] must be a positive integer .*, got true"),
    "layer key 'x'": (_set("attn_keep", "x", [[1, 1, 1]] * 2), r"layer key 'x' in attn_keep is not an integer"),
    "layer key '1.5'": (_set("num_heads", "1.5", 2), r"layer key '1\.5' in num_heads is not an integer"),
    "metadata null": (_set("metadata", None), r"metadata must be an object, got null"),
}


@pytest.mark.parametrize("damage,message", WIDTH_CASES.values(), ids=WIDTH_CASES.keys())
def test_bad_width_plan_file_names_file_key_and_value(tmp_path, damage, message):
    data = _width()
    damage(data)
    path = tmp_path / "width_plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="^" + re.escape(f"width plan file {str(path)!r}: ") + message):
        WidthPlan.load(path)
    with pytest.raises(PlanError, match="^" + message):
        WidthPlan.from_dict(data)


def test_width_masks_take_booleans_and_0_1_and_round_trip(tmp_path):
    data = _width()
    data["attn_keep"]["0"] = [[True, 0, 1], [False, True, 1]]  # JSON true / false / 0 / 1 mixed
    plan = WidthPlan.from_dict(data)
    assert plan.attn_keep[0].dtype == torch.bool
    assert plan.attn_keep[0].tolist() == [[True, False, True], [False, True, True]]
    assert plan.to_dict() == _width()
    path = plan.save(tmp_path / "width_plan.json")
    assert path.read_bytes() == (json.dumps(_width()) + "\n").encode()
    assert WidthPlan.load(path) == plan
    with pytest.raises(PlanError, match=r"^attn_keep\[0\]\[1\]\[0\] must be a keep flag .*, got 2$"):
        WidthPlan({0: torch.tensor([[1, 0, 1], [2, 1, 1]])}, {}, {0: 2}, {})

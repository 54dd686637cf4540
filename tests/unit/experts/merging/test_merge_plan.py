"""MergePlan: JSON round trip and a strict schema whose errors name the key and the value."""

from __future__ import annotations

import json

import pytest

import lightprune as lp
from lightprune.core.errors import PlanError


def plan(**changes) -> lp.MergePlan:
    fields = dict(clusters={0: [[0, 2, 5], [1], [3, 4], [6, 7]], 1: [[0, 1], [2, 3], [4, 5], [6, 7]]},
                  dominant={0: [2, 1, 4, 6], 1: [0, 3, 4, 7]},
                  coefficients={0: [[0.5, 0.3, 0.2], [1.0], [0.25, 0.75], [0.5, 0.5]],
                                1: [[0.5, 0.5], [0.1, 0.9], [1.0, 0.0], [0.5, 0.5]]},
                  num_experts={0: 8, 1: 8}, router="average", align=True, method="hc_smoe", ratio=0.5)
    fields.update(changes)
    return lp.MergePlan(**fields)


def test_round_trip_through_json(tmp_path) -> None:
    original = plan()
    path = original.save(tmp_path / "merge_plan.json")
    loaded = lp.MergePlan.load(path)
    assert loaded == original
    data = json.loads(path.read_text())
    assert set(data["clusters"]) == {"0", "1"} and data["router"] == "average" and data["align"] is True
    layout = loaded.expert_plan()
    assert layout.keep == {0: [1, 2, 4, 6], 1: [0, 3, 4, 7]} and loaded.is_uniform
    assert loaded.total_merged_away == 8 and layout.metadata["merge"] == original.to_dict()


def test_clusters_are_normalised_sorted_with_their_coefficients() -> None:
    p = plan(clusters={0: [[6, 7], [5, 2, 0], [1], [4, 3]]}, dominant={0: [6, 2, 1, 4]},
             coefficients={0: [[0.5, 0.5], [0.2, 0.3, 0.5], [1.0], [0.75, 0.25]]}, num_experts={0: 8})
    assert p.clusters[0] == [[0, 2, 5], [1], [3, 4], [6, 7]]
    assert p.coefficients[0] == [[0.5, 0.3, 0.2], [1.0], [0.25, 0.75], [0.5, 0.5]]
    assert p.dominant[0] == [2, 1, 4, 6]


@pytest.mark.parametrize("changes, message", [
    (dict(clusters={0: [[0, 2, 5], [1, 2], [3, 4], [6, 7]], 1: [[0, 1], [2, 3], [4, 5], [6, 7]]}),
     r"ids \[2\] appear twice"),
    (dict(clusters={0: [[0, 2, 5], [1], [3, 4], [6]], 1: [[0, 1], [2, 3], [4, 5], [6, 7]]}),
     r"ids \[7\] are in no cluster"),
    (dict(dominant={0: [0, 1, 4, 3], 1: [0, 3, 4, 7]}), r"dominant\[0\]\[3\] = 3 is not a member of .*\[6, 7\]"),
    (dict(coefficients={0: [[0.5, 0.3, 0.3], [1.0], [0.25, 0.75], [0.5, 0.5]],
                        1: [[0.5, 0.5], [0.1, 0.9], [1.0, 0.0], [0.5, 0.5]]}), r"must sum to 1.*sum 1\.1"),
    (dict(coefficients={0: [[1.5, -0.3, -0.2], [1.0], [0.25, 0.75], [0.5, 0.5]],
                        1: [[0.5, 0.5], [0.1, 0.9], [1.0, 0.0], [0.5, 0.5]]}), r"\[1\] must be a finite non-negative"),
    (dict(router="sum"), r"router must be one of \['dominant', 'average'\], got \"sum\""),
    (dict(align="yes"), r"align must be true or false"),
    (dict(num_experts={0: 8}), r"num_experts names layers \[0\], clusters names \[0, 1\]"),
    (dict(num_experts={0: 8, 1: 0}), r"num_experts\[1\] must be a positive integer"),
    (dict(ratio=1.0), r"ratio must be a number in \[0, 1\)"),
])
def test_schema_violations_name_the_value(changes, message) -> None:
    with pytest.raises(PlanError, match=message):
        plan(**changes)


def test_a_loaded_file_is_named_and_unknown_keys_refused(tmp_path) -> None:
    data = plan().to_dict()
    data["keep"] = {}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match=r"bad\.json.*unknown merge plan keys \['keep'\]"):
        lp.MergePlan.load(path)


def test_a_plan_for_another_model_or_below_the_floor_is_refused(tiny) -> None:
    layers = lp.find_moe_layers(tiny("mixtral"))  # 8 experts, top-2, layers 0 and 1
    plan().check_layers(layers)
    with pytest.raises(PlanError, match="made for 10 experts in layer 0, the model has 8"):
        plan(clusters={0: [list(range(10))], 1: [[0, 1], [2, 3], [4, 5], [6, 7]]}, dominant={0: [0], 1: [0, 3, 4, 7]},
             coefficients={0: [[0.1] * 10], 1: [[0.5, 0.5], [0.1, 0.9], [1.0, 0.0], [0.5, 0.5]]},
             num_experts={0: 10, 1: 8}).check_layers(layers)
    with pytest.raises(PlanError, match="below its floor"):
        plan(clusters={0: [list(range(8))], 1: [[0, 1], [2, 3], [4, 5], [6, 7]]}, dominant={0: [3], 1: [0, 3, 4, 7]},
             coefficients={0: [[0.125] * 8], 1: [[0.5, 0.5], [0.1, 0.9], [1.0, 0.0], [0.5, 0.5]]}).check_layers(layers)

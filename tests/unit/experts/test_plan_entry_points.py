"""Every entry point that takes a plan checks it against the model before anything changes, and takes both plan
kinds or refuses the other by name.

A plan that leaves a MoE layer out, names a layer the model does not have, was made for another expert count or
keeps fewer experts than a layer routes to is a ``PlanError``; a MergePlan where an ExpertPlan is needed (and the
reverse) a ``TypeError`` saying what to call instead. In every case the model's tensors are bitwise what they were,
no mask is left installed and no output directory is written.
"""

from __future__ import annotations

import pytest
import torch

import lightprune as lp
from lightprune.experts.mask import is_masked
from lightprune.experts.merging import write_merged


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _full_plan(model) -> lp.ExpertPlan:
    return lp.select_experts(lp.score_weights(model, "random", seed=1), ratio=0.5)


def _merge_plan(layers, drop: int | None = None, extra: int | None = None) -> lp.MergePlan:
    """Pairs (0, 1), (2, 3), ... merged into their first member, in every layer but ``drop`` (plus ``extra``)."""
    indices = [layer.index for layer in layers if layer.index != drop] + ([extra] if extra is not None else [])
    n = layers[0].num_experts
    return lp.MergePlan(clusters={i: [[e, e + 1] for e in range(0, n, 2)] for i in indices},
                        dominant={i: list(range(0, n, 2)) for i in indices},
                        coefficients={i: [[0.5, 0.5]] * (n // 2) for i in indices},
                        num_experts={i: n for i in indices})


def _bad_plans(model) -> dict[str, tuple[lp.ExpertPlan, str]]:
    plan = _full_plan(model)
    layers = sorted(plan.keep)
    first, last = layers[0], layers[-1]
    n = plan.num_experts[first]
    return {
        "leaves a layer out": (lp.ExpertPlan(keep={k: v for k, v in plan.keep.items() if k != last},
                                             num_experts={k: v for k, v in plan.num_experts.items() if k != last}),
                               f"plan leaves out MoE layers [{last}] of this model"),
        "names another layer": (lp.ExpertPlan(keep={**plan.keep, 99: [0, 1]}, num_experts={**plan.num_experts, 99: n}),
                                "plan names layers [99] that are not MoE layers of this model"),
        "another expert count": (lp.ExpertPlan(keep=plan.keep, num_experts={**plan.num_experts, first: 2 * n}),
                                 f"plan was made for {2 * n} experts in layer {first}"),
        "below the floor": (lp.ExpertPlan(keep={**plan.keep, first: [0]}, num_experts=plan.num_experts),
                            f"plan keeps 1 experts in layer {first}, below its floor of 2"),
    }


ENTRY_POINTS = ["mask_experts", "prune_experts", "export_pruned", "prune_checkpoint"]


def _call(name: str, model, plan, tmp_path):
    if name == "mask_experts":
        with lp.mask_experts(model, plan):
            pass
    elif name == "prune_experts":
        lp.prune_experts(model, plan)
    elif name == "export_pruned":
        lp.export_pruned(model, plan, tmp_path / "out")
    else:
        model.save_pretrained(tmp_path / "ckpt")
        lp.prune_checkpoint(tmp_path / "ckpt", plan, tmp_path / "out", progress=False)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("case", ["leaves a layer out", "names another layer", "another expert count",
                                  "below the floor"])
def test_a_plan_that_does_not_fit_is_refused_before_anything_changes(tiny, tmp_path, entry, case):
    model = tiny("qwen3_moe", seed=0)
    plan, message = _bad_plans(model)[case]
    before = _state(model)
    with pytest.raises(lp.PlanError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _call(entry, model, plan, tmp_path)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert not is_masked(model) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("entry", ["write_merged", "merge_experts", "merged_experts", "export_pruned"])
@pytest.mark.parametrize("case", ["leaves a layer out", "names another layer"])
def test_a_merge_plan_that_does_not_fit_is_refused_before_any_merge(tiny, tmp_path, entry, case):
    model = tiny("qwen3_moe", seed=0)
    layers = lp.find_moe_layers(model)
    plan = _merge_plan(layers, drop=layers[-1].index) if case == "leaves a layer out" else _merge_plan(layers, extra=99)
    before = _state(model)
    with pytest.raises(lp.PlanError, match="leaves out MoE layers|not MoE layers of this model"):
        if entry == "write_merged":
            write_merged(model, plan)
        elif entry == "merge_experts":
            lp.merge_experts(model, plan)
        elif entry == "merged_experts":
            with lp.merged_experts(model, plan):
                pass
        else:
            lp.export_pruned(model, plan, tmp_path / "out")
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert not is_masked(model) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("entry, advice", [("mask_experts", "lp.merged_experts"), ("prune_experts", "lp.merge_experts"),
                                           ("prune_checkpoint", "lp.export_pruned(model, merge_plan, out_dir)")])
def test_a_merge_plan_where_an_expert_plan_is_needed_is_refused_by_name(tiny, tmp_path, entry, advice):
    model = tiny("qwen3_moe", seed=0)
    plan = _merge_plan(lp.find_moe_layers(model))
    before = _state(model)
    with pytest.raises(TypeError, match=rf"{entry} takes an ExpertPlan, got MergePlan: .*{advice.replace('(', '[(]').replace(')', '[)]')}"):
        _call(entry, model, plan, tmp_path)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("entry", ["merge_experts", "merged_experts", "write_merged"])
def test_an_expert_plan_where_a_merge_plan_is_needed_is_refused_by_name(tiny, entry):
    model = tiny("qwen3_moe", seed=0)
    plan = _full_plan(model)
    with pytest.raises(TypeError, match=rf"{entry} takes a MergePlan, got ExpertPlan: .*lp.prune_experts"):
        if entry == "merged_experts":
            with lp.merged_experts(model, plan):
                pass
        else:
            getattr(lp, entry, None)(model, plan) if entry != "write_merged" else write_merged(model, plan)


def test_something_else_is_refused_with_how_to_make_a_plan(tiny, tmp_path):
    model = tiny("qwen3_moe", seed=0)
    with pytest.raises(TypeError, match=r"prune_experts takes an ExpertPlan, got dict: .*lp.ExpertPlan.load"):
        lp.prune_experts(model, {"keep": {}})
    with pytest.raises(TypeError, match=r"export_pruned takes an ExpertPlan \(pruning\) or a MergePlan"):
        lp.export_pruned(model, {"keep": {}}, tmp_path / "out")


def test_a_completed_plan_keeps_the_layers_left_out_whole(tiny, tmp_path):
    """The explicit way to leave layers unpruned: ``plan.completed(layers)`` keeps every expert of them."""
    model = tiny("qwen3_moe", seed=0)
    plan = _bad_plans(model)["leaves a layer out"][0]
    layers = lp.find_moe_layers(model)
    completed = plan.completed(layers)
    left_out = layers[-1]
    assert completed.keep[left_out.index] == list(range(left_out.num_experts))
    result = lp.export_pruned(model, completed, tmp_path / "out")
    assert result.experts_per_layer[left_out.index] == left_out.num_experts

"""MWOP quality rows on the dense-mllm-micro testbed: every figure recomputed independently of the module."""

from __future__ import annotations

import contextlib
import io
import json
import math
import statistics

import pytest
import torch
from fixtures import REPO

import lightprune as lp
from lightprune.quality.mwop_section import mwop_markdown, plot_mwop
from lightprune.quality.width_quality import PAPER_OPERATING_POINTS, mwop_quality
from lightprune.testbed.vqa_models import VQA_TESTBEDS, datamodule, vqa_testbed
from lightprune.width.paths import PATHS
from lightprune.width.plan import WidthPlan

NAME = "dense-mllm-micro"
SEEDS = 3
ALIGN = 8  # the micro model's FFN has 24 channels: b = 8 lets the kept-channel counts show in the FLOPs


@pytest.fixture(scope="module")
def testbed(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    folder = vqa_testbed(NAME, root=root, progress=False)
    model = lp.load_pruned(folder / "model")
    dm = datamodule(VQA_TESTBEDS[NAME], folder / "model", root)
    return model, dm


@pytest.fixture(scope="module")
def run(testbed):
    """(result, what the progress bar wrote to stderr)."""
    model, dm = testbed
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        result = mwop_quality(model, dm, random_seeds=SEEDS, align=ALIGN, metric="token", progress=True)
    return result, err.getvalue()


@pytest.fixture(scope="module")
def result(run):
    return run[0]


def _rows(result, method):
    return {r["operating_point"]: r for r in result["rows"] if r["method"] == method}


def _plan(row, entry, model) -> WidthPlan:
    """A row's plan: kept with Taylor and dense rows, drawn again from its seed for a random plan."""
    from lightprune.quality.width_quality import random_width_plan

    return random_width_plan(model, row["ratios"], entry["seed"]) if row["method"] == "random" else \
        WidthPlan.from_dict(entry["plan"])


def _pruned_units(plan: WidthPlan, column: int) -> set[tuple[int, int]]:
    return {(l, h) for l, keep in plan.attn_keep.items() for h in range(keep.shape[0]) if not keep[h, column]}


def _lowest(scores: dict, layers: list[int], k: int) -> set[tuple[int, int]]:
    """The k lowest (layer, unit) by score, ties to the earlier unit: a plain sort, no library code."""
    flat = [(float(scores[l][i]), n, (l, i)) for n, (l, i) in
            enumerate((l, i) for l in layers for i in range(len(scores[l])))]
    return {unit for _, _, unit in sorted(flat)[:k]}


def test_dense_row(result, testbed):
    model, dm = testbed
    dense = _rows(result, "dense")["dense"]
    assert dense["atr"] == 100.0
    assert dense["flops_fraction"] == 1.0
    assert all(v == 0.0 for v in dense["pruned"].values())
    # teacher-forced answer-token accuracy per task, by hand
    # the answer tokens: labelled, less the end-of-turn marker and the labelled newline after it
    end = dm.processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    hits = torch.zeros(len(dm.task_names), dtype=torch.float64)
    total, nll = torch.zeros_like(hits), torch.zeros_like(hits)
    model.eval()
    with torch.no_grad():
        for batch in dm.dataloader("val"):
            inputs = {k: v for k, v in batch.items() if k not in ("labels", "task_ids")}
            logp = torch.log_softmax(model(**inputs).logits[:, :-1].double(), -1)
            target = batch["labels"][:, 1:]
            for b, task in enumerate(batch["task_ids"].tolist()):
                previous_end = False
                for t, label in enumerate(target[b].tolist()):
                    if label == -100 or label == end or previous_end:
                        previous_end = label == end
                        continue
                    hits[task] += int(logp[b, t].argmax()) == label
                    total[task] += 1
                    nll[task] -= float(logp[b, t, label])
    assert (total > 0).all()
    expected = (hits / total).tolist()
    got = [dense["per_task_accuracy"][n] for n in dm.task_names]
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert result["end_of_turn_ids"] == [end]
    loss = [dense["per_task_answer_loss"][n] for n in dm.task_names]
    assert loss == pytest.approx((nll / total).tolist(), rel=1e-5)
    assert dense["atr_interval"] == pytest.approx([100.0, 100.0]) and dense["answer_ppl_atr"] == pytest.approx(100.0)
    assert [result["reference"][n] for n in dm.task_names] == got
    assert result["task_names"] == list(dm.task_names)


def test_retention_from_accuracies(result):
    reference = result["reference"]
    defined = [n for n, r in reference.items() if r]
    assert defined, "the micro testbed must answer some token right"
    for row in _rows(result, "taylor").values():
        per_task = {n: 100.0 * row["per_task_accuracy"][n] / reference[n] for n in defined}
        assert row["atr"] == pytest.approx(statistics.fmean(per_task.values()), rel=1e-12)
        assert sorted(row["excluded"]) == sorted(set(reference) - set(defined))
        dense_loss = _rows(result, "dense")["dense"]["per_task_answer_loss"]
        kept = [100.0 * math.exp(dense_loss[n] - row["per_task_answer_loss"][n]) for n in defined]
        assert row["answer_ppl_atr"] == pytest.approx(statistics.fmean(kept), rel=1e-12)
        for key in ("atr", "answer_ppl_atr"):  # the bootstrap interval brackets the point
            low, high = row[f"{key}_interval"]
            assert low - 1e-9 <= row[key] <= high + 1e-9, key
        low, high = row["answer_ppl_atr_interval"]  # a continuous score: resampled rows move it, unless the plan
        assert low < high or low == high == pytest.approx(row["answer_ppl_atr"])  # leaves every answer as it was


def test_token_profile_and_flops(result, testbed):
    model, dm = testbed
    image = model.config.image_token_id
    vision = text = samples = 0
    for batch in dm.dataloader("val"):
        for ids, mask in zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist()):
            valid = [t for t, m in zip(ids, mask) if m]
            first = valid.index(image) if image in valid else 0  # tokens before the first image: system
            vision += sum(t == image for t in valid)
            text += sum(t != image for t in valid[first:])
            samples += 1
    profile = result["profile"]
    assert profile["samples"] == samples
    assert profile["mean_vision_tokens"] == vision / samples and profile["mean_text_tokens"] == text / samples
    assert (profile["vision_tokens"], profile["text_tokens"]) == (round(vision / samples), round(text / samples))
    assert profile["vision_tokens"] > 0 and profile["text_tokens"] > 0
    for row in result["rows"]:
        for entry in row.get("per_seed", [row]):
            plan = _plan(row, entry, model)
            flops = lp.decoder_flops(model.config, profile["vision_tokens"], profile["text_tokens"], plan=plan,
                                     align=ALIGN)
            assert entry["flops_fraction"] == flops.fraction
            every_channel = lp.decoder_flops(model.config, profile["vision_tokens"], profile["text_tokens"],
                                             plan=plan, align=1)
            assert entry["flops_fraction_align_1"] == every_channel.fraction
            assert (entry["flops_fraction"] < 1.0) == (row["method"] != "dense")
    for name, row in _rows(result, "random").items():
        fractions = [e["flops_fraction"] for e in row["per_seed"]]
        assert row["flops_fraction"]["min"] == min(fractions) and row["flops_fraction"]["max"] == max(fractions)


def test_plans_prune_the_asked_share(result, testbed):
    rows = [r for r in result["rows"] if r["method"] != "dense"]
    assert {r["operating_point"] for r in rows} == set(PAPER_OPERATING_POINTS)
    for row in rows:
        ratios = PAPER_OPERATING_POINTS[row["operating_point"]]
        assert row["ratios"] == ratios
        for entry in row.get("per_seed", [row]):
            plan = _plan(row, entry, testbed[0])
            heads = sum(plan.num_heads.values())
            for column, path in enumerate(PATHS):
                pruned = sum(int((~keep[:, column]).sum()) for keep in plan.attn_keep.values())
                assert pruned == round(ratios.get(path, 0.0) * heads), (row["operating_point"], path)
            channels = sum(plan.intermediate_size.values())
            for mu in ("vision", "text"):
                pruned = sum(int((~masks[mu]).sum()) for masks in plan.ffn_keep.values())
                assert pruned == round(ratios.get(f"ffn_{mu}", 0.0) * channels), (row["operating_point"], mu)
    llava = _rows(result, "taylor")["LLaVA-OneVision-7B"]
    assert llava["pruned"]["v2v"] > 0 and llava["pruned"]["ffn_vision"] > 0 and llava["pruned"]["ffn_text"] == 0


def test_taylor_plans_prune_the_lowest_scored_units(result, testbed):
    model, dm = testbed
    calibration = list(dm.dataloader("calibration"))
    attn = lp.taylor_importance(model, calibration, attention=True, progress=False)
    stored = lp.WidthScores.from_dict(result["scores"]["attn"])
    assert stored.num_samples == attn.num_samples == sum(len(b["input_ids"]) for b in calibration)
    for l in attn.attn:
        assert torch.allclose(stored.attn[l], attn.attn[l], rtol=1e-10, atol=0)
    for name, row in _rows(result, "taylor").items():
        ratios = PAPER_OPERATING_POINTS[name]
        plan = WidthPlan.from_dict(row["plan"])
        layers = sorted(plan.num_heads)
        heads = sum(plan.num_heads.values())
        for column, path in enumerate(PATHS):
            scores = {l: attn.attn[l][:, column].tolist() for l in layers}
            want = _lowest(scores, layers, round(ratios[path] * heads))
            assert _pruned_units(plan, column) == want, (name, path)
        # FFN importance with this operating point's attention masks (and dense FFNs) applied
        paths_only = WidthPlan(plan.attn_keep, {}, plan.num_heads, plan.intermediate_size)
        ffn = lp.taylor_importance(model, calibration, attention=False, ffn=True, plan=paths_only, progress=False)
        stored_ffn = lp.WidthScores.from_dict(result["scores"]["ffn"][name])
        dense_layers = sorted(plan.intermediate_size)
        for l in dense_layers:
            assert torch.allclose(stored_ffn.ffn[l]["vision"], ffn.ffn[l]["vision"], rtol=1e-10, atol=0)
        scores = {l: ffn.ffn[l]["vision"].tolist() for l in dense_layers}
        want = _lowest(scores, dense_layers, round(ratios["ffn_vision"] * sum(plan.intermediate_size.values())))
        got = {(l, c) for l, masks in plan.ffn_keep.items() for c in range(len(masks["vision"]))
               if not masks["vision"][c]}
        assert got == want, name


def test_all_tasks_plans_rank_by_the_minimum_of_the_task_families_ranks(result, testbed):
    model, dm = testbed
    per_task = {t: list(dm.dataloader("calibration", tasks=[t])) for t in dm.task_names}
    assert result["scores"]["all_tasks"]["tasks"] == list(dm.task_names) and all(per_task.values())
    attn = lp.width.min_rank_scores([lp.taylor_importance(model, b, attention=True, progress=False)
                                     for b in per_task.values()])
    for name, row in _rows(result, "taylor_all_tasks").items():
        ratios = PAPER_OPERATING_POINTS[name]
        plan = WidthPlan.from_dict(row["plan"])
        layers = sorted(plan.num_heads)
        for column, path in enumerate(PATHS):
            scores = {l: attn.attn[l][:, column].tolist() for l in layers}
            want = _lowest(scores, layers, round(ratios[path] * sum(plan.num_heads.values())))
            assert _pruned_units(plan, column) == want, (name, path)
        assert row["pruned"]["ffn_vision"] == pytest.approx(ratios["ffn_vision"], abs=0.05)
    taylor = _rows(result, "taylor")
    assert any(_rows(result, "taylor_all_tasks")[n]["plan"] != taylor[n]["plan"] for n in taylor)


def test_random_rows(result, testbed):
    """Random rows keep their seeds, not their masks: each plan is drawn again from its seed (the same masks for the
    same seed, whatever the weights: a model of the same shapes with other weights draws the same plan)."""
    from lightprune.quality.width_quality import random_width_plan

    model, _ = testbed
    other = type(model)(model.config)
    for name, row in _rows(result, "random").items():
        assert row["seeds"] == list(range(SEEDS)) and len(row["per_seed"]) == SEEDS
        assert all("plan" not in e for e in row["per_seed"])
        drawn = [random_width_plan(model, row["ratios"], e["seed"]) for e in row["per_seed"]]
        plans = [json.dumps(p.to_dict()["attn_keep"], sort_keys=True) for p in drawn]
        assert len(set(plans)) == SEEDS, f"{name}: random seeds gave identical attention plans"
        assert [random_width_plan(other, row["ratios"], e["seed"]).to_dict() for e in row["per_seed"]] == \
            [p.to_dict() for p in drawn]
        for plan, entry in zip(drawn, row["per_seed"]):
            assert {u: plan.pruned_fraction(u) for u in entry["pruned"]} == entry["pruned"]
        atrs = [e["atr"] for e in row["per_seed"]]
        assert row["atr"]["mean"] == pytest.approx(statistics.fmean(atrs), rel=1e-12)
        assert row["atr"]["std"] == pytest.approx(statistics.stdev(atrs), rel=1e-12, abs=1e-12)
        assert (row["atr"]["min"], row["atr"]["max"]) == (min(atrs), max(atrs))
        for task, stats in row["per_task_accuracy"].items():
            accs = [e["per_task_accuracy"][task] for e in row["per_seed"]]
            assert (stats["min"], stats["max"]) == (min(accs), max(accs))
    json.dumps(result, allow_nan=False)  # JSON-ready: NaN written as None


def test_taylor_standing_against_the_random_plans(result):
    """Each Taylor row's standing (the one rule's inputs): its p-value among the random plans' ATRs and its paired
    difference to their mean, recomputed from the rows' own ATRs."""
    for method in ("taylor", "taylor_all_tasks"):
        for name, row in _rows(result, method).items():
            randoms = _rows(result, "random")[name]["per_seed"]
            for key in ("atr", "answer_ppl_atr"):
                record, null = row["standing"][key], [e[key] for e in randoms]
                assert record["null_size"] == SEEDS and record["testbed_seed"] == 0
                assert record["p_value"] == (1 + sum(v >= row[key] for v in null)) / (1 + SEEDS)
                assert record["paired_diff"] == pytest.approx(row[key] - statistics.fmean(null), rel=1e-9,
                                                              abs=1e-9)
                low, high = record["paired_ci"]
                assert low <= high and (low < high or all(v == row[key] for v in null))


def test_markdown_and_plot(result, tmp_path):
    from PIL import Image

    text = mwop_markdown(result)
    table = [line for line in text.splitlines() if line.startswith("| ")]
    # header, dense, then per point taylor, All Tasks and random
    assert len(table) == 1 + 1 + 3 * len(PAPER_OPERATING_POINTS)
    assert all(n in table[0] for n in result["task_names"]) and "ATR (%) [95% CI]" in table[0]
    llava = _rows(result, "taylor")["LLaVA-OneVision-7B"]
    low, high = llava["atr_interval"]
    standing = llava["standing"]["atr"]
    assert (f"{llava['flops_fraction']:.3f} | {llava['flops_fraction_align_1']:.3f} | {llava['atr']:.1f} "
            f"[{low:.1f}, {high:.1f}]; p {standing['p_value']:.3f}, d {standing['paired_diff']:+.1f} "
            f"[{standing['paired_ci'][0]:+.1f}, {standing['paired_ci'][1]:+.1f}] | {llava['answer_ppl_atr']:.1f} [") \
        in text
    assert f"random ({SEEDS} seeds)" in text
    assert "| dense | - | dense | 1.000 | 1.000 | 100.0 [100.0, 100.0] | 100.0 [100.0, 100.0] |" in text
    path = plot_mwop(result, tmp_path / "sub" / "mwop.png")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size[0] > 100


def test_progress_bar(run):
    bar = run[1]
    evaluations = 1 + len(PAPER_OPERATING_POINTS) * (2 + SEEDS)
    assert "MWOP quality" in bar and f"{evaluations}/{evaluations}" in bar and "taylor importance" in bar


def test_attention_only_point_without_random_rows(testbed):
    model, dm = testbed
    out = mwop_quality(model, dm, operating_points={"half v2v": {"v2v": 0.5}}, random_seeds=0, all_tasks=False,
                       progress=False)
    assert [r["method"] for r in out["rows"]] == ["dense", "taylor"] and out["scores"]["ffn"] == {}
    assert "all_tasks" not in out["scores"]
    assert out["rows"][1]["pruned"] == {"v2v": 0.5, "t2v": 0.0, "t2t": 0.0, "ffn_vision": 0.0, "ffn_text": 0.0}


@pytest.mark.parametrize("kwargs, match", [
    (dict(operating_points={"x": {"v2x": 0.4}}), "v2x"),
    (dict(operating_points={"x": {"t2v": 1.5}}), "1.5"),
    (dict(operating_points={"x": {"ffn_vision": -0.1}}), "-0.1"),
    (dict(operating_points={"dense": {"v2v": 0.1}}), "dense"),
    (dict(random_seeds=-1), "random_seeds"),
    (dict(metric="bleu"), "bleu"),
    (dict(align=0), "align"),
])
def test_bad_values_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mwop_quality(None, None, **kwargs)


def test_recovery_rows(result, testbed):
    from lightprune.quality.width_recovery import mwop_recovery, mwop_recovery_markdown

    model, dm = testbed
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # learning rate 0: recovery changes nothing, so every row equals its training-free row exactly
    still = mwop_recovery(model, dm, result, random_seeds=2, epochs=1, learning_rate=0.0, progress=False)
    free = {(r["operating_point"], r["method"]): r for r in result["rows"] if r["method"] != "random"}
    for r in still["rows"]:
        want = free[(r["operating_point"], r["method"])] if r["method"] != "random" else \
            next(e for e in _rows(result, "random")[r["operating_point"]]["per_seed"] if e["seed"] == r["seed"])
        assert r["atr"] == pytest.approx(want["atr"], rel=1e-12) and r["flops_fraction"] == want["flops_fraction"]
        assert r["answer_ppl_atr"] == pytest.approx(want["answer_ppl_atr"], rel=1e-9)
    assert sorted({r["method"] for r in still["rows"]}) == ["dense", "random", "taylor", "taylor_all_tasks"]
    for r in (r for r in still["rows"] if r["method"] == "taylor"):  # against the recovered random plans' mean
        randoms = [e["atr"] for e in still["rows"] if e["method"] == "random"
                   and e["operating_point"] == r["operating_point"]]
        assert r["versus"]["random"]["atr"]["paired_diff"] == pytest.approx(r["atr"] - statistics.fmean(randoms),
                                                                            rel=1e-9, abs=1e-9)
    assert sum(r["method"] == "random" for r in still["rows"]) == 2 * len(PAPER_OPERATING_POINTS)
    assert still["steps"] == len(list(dm.train_dataloader()))
    moved = mwop_recovery(model, dm, result, random_seeds=1, epochs=1, learning_rate=1e-3, progress=False)
    assert any(r["answer_ppl_atr"] != pytest.approx(s["answer_ppl_atr"], rel=1e-9)
               for r, s in zip(moved["rows"], still["rows"]) if r["method"] != "random")
    # the recovered plans are scored against the dense model given the same recovery, which itself moved
    dense = next(r for r in moved["rows"] if r["method"] == "dense")
    assert dense["answer_ppl_atr"] != pytest.approx(100.0, rel=1e-9)
    taylor = next(r for r in moved["rows"] if r["method"] == "taylor")
    assert taylor["per_task_retention"] == {
        n: None if a is None or d is None or not d else pytest.approx(100.0 * a / d, rel=1e-9)
        for (n, a), d in zip(taylor["per_task_accuracy"].items(), dense["per_task_accuracy"].values())}
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the dense model is untouched
    text = mwop_recovery_markdown(moved)
    assert "after recovery" in text and f"{moved['steps']} steps" in text
    _check_claims({**result, "recovery": moved})
    _check_records({**result, "recovery": moved})


def _check_records(table) -> None:
    """scripts/recompute_results.py recomputes every ATR, interval, p-value and paired difference of the table
    (training-free and after recovery, random plans one by one) from its records alone, and catches a row sum
    changed by a thousandth."""
    import importlib.util
    import tempfile
    from pathlib import Path

    from lightprune.quality.records import pack

    spec = importlib.util.spec_from_file_location("recompute_results", REPO / "scripts" / "recompute_results.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "mwop-seed0.json"
        path.write_text(json.dumps({"tables": table}))
        checker = script.Checker()
        assert script.check_width_seed(path, checker) is not None
        randoms = sum(len(r["per_seed"]) for r in table["rows"] if r["method"] == "random")
        # per scored plan two values and two intervals; per Taylor row three p-values and a paired d and interval
        assert checker.bad == [] and checker.checked > 4 * (randoms + len(table["recovery"]["rows"]))
        broken = json.loads(path.read_text())
        key = next(k for k in broken["tables"]["records"]["plans"] if "/taylor" in k)
        rows = script.unpack(broken["tables"]["records"]["plans"][key])
        fields = broken["tables"]["records"]["fields"]
        count = rows.size // len(fields)
        nll = rows[fields.index("nll") * count:(fields.index("nll") + 1) * count]
        nll[int(nll.argmax())] *= 1.001  # the largest row nll, by a thousandth (a view: changes rows)
        broken["tables"]["records"]["plans"][key] = pack(torch.from_numpy(rows))
        path.write_text(json.dumps(broken))
        checker = script.Checker()
        script.check_width_seed(path, checker)
        assert any(key in line and "answer_ppl_atr" in line for line in checker.bad)


def _check_claims(table) -> None:
    """The MWOP checks over two seeds of this table: a record per seed and operating point, each the Taylor row's
    own standing (training-free) or its versus-random record (after recovery), and the verdict by the one rule."""
    from lightprune.quality.claims import claim_verdict, claims_over_seeds, comparison_verdict

    again = json.loads(json.dumps({**table, "rows": [
        {**r, "standing": {k: {**v, "testbed_seed": 1} for k, v in r["standing"].items()}} if "standing" in r else r
        for r in table["rows"]]}))
    checks = [c for c in claims_over_seeds(mwop=[table, again], min_seeds=1) if c["testbed"] == "mwop"]
    assert len(checks) == 4 and {c["metric"] for c in checks} == {"atr", "answer_ppl_atr"}
    for c in checks:
        rows = table["rows"] if c["rival"] is None else table["recovery"]["rows"]
        taylor = [r for r in rows if r["method"] == "taylor"]
        records = [r["standing"][c["metric"]] if c["rival"] is None else r["versus"]["random"][c["metric"]]
                   for r in taylor]
        assert [s["operating_point"] for s in c["seeds"]] == [r["operating_point"] for r in taylor] * 2
        assert [s["paired_diff"] for s in c["seeds"]] == [r["paired_diff"] for r in records] * 2
        assert [s["testbed_seed"] for s in c["seeds"]][:len(taylor)] == [0] * len(taylor)
        rule = claim_verdict if c["rival"] is None else comparison_verdict
        assert c["verdict"] == rule(c["seeds"])

"""scripts/quality_table.py end to end on the micro testbeds: every number of the page recomputed independently."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import math
import statistics
from pathlib import Path

import pytest
import torch
from fixtures import REPO

import lightprune as lp
from lightprune.quality.intervals import retention
from lightprune.testbed import TEXT_TESTBEDS, build_text_corpus, text_testbed
from lightprune.testbed.text_moe import corpus_datamodule
from lightprune.testbed.vqa_models import VQA_TESTBEDS

pytestmark = pytest.mark.exhaustive  # the exhaustive tier only: the quality tables measured on a trained micro testbed


REPO = REPO
MICRO = TEXT_TESTBEDS["micro"]


def _script():
    spec = importlib.util.spec_from_file_location("quality_table", REPO / "scripts" / "quality_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def page(testbed_root: Path, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("results")
    _script().main(["--micro", "--parts", "text", "mllm", "--random-seeds", "2", "--out", str(out), "--root",
                    str(testbed_root), "--no-progress"])
    return out, json.loads((out / "results" / "results.json").read_text())


def _ppl_of_pruned(model, plan, testbed_root: Path, rows_per_domain: int) -> float:
    """exp(summed next-token CE / tokens) of the physically pruned model over the first test rows of each domain."""
    nll, count = _rows_of_pruned(model, plan, testbed_root, rows_per_domain)
    return math.exp(float(nll.sum() / count.sum()))


def _rows_of_pruned(model, plan, testbed_root: Path, rows_per_domain: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per test row (the first of each domain, prose then code), one at a time without padding: the physically
    pruned model's summed next-token CE and the row's predicted tokens."""
    pruned = copy.deepcopy(model)
    lp.prune_experts(pruned, plan)
    corpus = build_text_corpus(MICRO.corpus, testbed_root)
    tokenizer = corpus_datamodule(MICRO, corpus).tokenizer
    rows = [json.loads(line) for line in corpus.files["test"].read_text().splitlines()]
    nll, count = [], []
    for domain in ("prose", "code"):
        for row in [r for r in rows if r["domain"] == domain][:rows_per_domain]:
            ids = torch.tensor([(tokenizer(row["text"])["input_ids"] + [tokenizer.eos_token_id])[: MICRO.max_length]])
            with torch.no_grad():
                logits = pruned(input_ids=ids).logits[0, :-1]
            nll.append(float(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum")))
            count.append(ids.shape[1] - 1)
    return torch.tensor(nll, dtype=torch.float64), torch.tensor(count, dtype=torch.float64)


def test_text_rows_equal_physically_pruned_models(page, testbed_root: Path) -> None:
    out, data = page
    text = data["text"]
    model = lp.load_pruned(text_testbed("micro", testbed_root) / "model").eval()
    for row in (r for r in text["rows"] if r["criterion"] == "aimer"):  # weight-only: an independent plan
        plan = lp.select_experts(lp.score_weights(model, "aimer"), row["ratio"])
        assert row["pruned_per_layer"] == {str(l): len(p) for l, p in plan.pruned().items()}
        assert row["metrics"]["ppl"] == pytest.approx(_ppl_of_pruned(model, plan, testbed_root, 4), rel=1e-4)
    dense_plan = lp.select_experts(lp.score_weights(model, "aimer"), 0.0)
    assert text["dense"]["ppl"] == pytest.approx(_ppl_of_pruned(model, dense_plan, testbed_root, 4), rel=1e-4)


def test_every_row_carries_the_bootstrap_interval_of_its_physically_pruned_model(page, testbed_root: Path) -> None:
    from lightprune.quality.intervals import retention_interval

    out, data = page
    text = data["text"]
    model = lp.load_pruned(text_testbed("micro", testbed_root) / "model").eval()
    dense = _rows_of_pruned(model, lp.select_experts(lp.score_weights(model, "aimer"), 0.0), testbed_root, 4)
    md = (out / "RESULTS.md").read_text()
    for row in (r for r in text["rows"] if r["criterion"] == "aimer"):
        pruned = _rows_of_pruned(model, lp.select_experts(lp.score_weights(model, "aimer"), row["ratio"]),
                                 testbed_root, 4)
        expected = retention_interval("ppl", dense, pruned)
        assert row["intervals"]["ppl"] == pytest.approx(expected, rel=1e-3)
        point = retention("ppl", row["metrics"]["ppl"], text["dense"]["ppl"])
        assert expected[0] <= point <= expected[1] and expected[0] < expected[1]
        line = next(x for x in md.splitlines() if x.startswith("| aimer | ") and "uniform" not in x)
        assert f"{point:.1f} [{row['intervals']['ppl'][0]:.1f}, {row['intervals']['ppl'][1]:.1f}]" in line
    for part, metrics in (("text", {"ppl", "ppl_prose", "ppl_code", "acc", "acc_prose", "acc_code"}),
                          ("mllm", {"acc_image", "acc_digit", "acc_chart_left", "acc_chart_count", "ppl_image",
                                   "ppl_text"})):
        assert all(metrics <= set(r["intervals"]) for r in data[part]["rows"]), part


def _image_answer_ppl_of_pruned(model, plan, testbed_root: Path) -> float:
    """exp(mean answer-token CE) over the val split's image rows of the physically pruned model, one row at a time
    (no padding): the next-token targets that are labelled, neither an end-of-turn marker nor the token after one."""
    from lightprune.core.batch import model_inputs
    from lightprune.data.tokenizer import end_of_turn_ids
    from lightprune.testbed.vqa_models import VQA_TESTBEDS, datamodule, vqa_testbed

    pruned = copy.deepcopy(model)
    lp.prune_experts(pruned, plan)
    spec = VQA_TESTBEDS["mllm-moe-canvas-micro"]
    dm = datamodule(spec, str(vqa_testbed("mllm-moe-canvas-micro", testbed_root) / "model"), testbed_root, batch_size=1)
    dm.setup("fit")
    ends = set(end_of_turn_ids(dm))
    nll, count = 0.0, 0
    for batch in dm.dataloader("val", tasks=[t for t in dm.task_names if t != "text"]):
        with torch.no_grad():
            logits = pruned(**model_inputs(batch)).logits[0, :-1].double()
        targets = batch["labels"][0, 1:].tolist()
        for i, t in enumerate(targets):
            if t != -100 and t not in ends and not (i and targets[i - 1] in ends):
                nll -= float(torch.log_softmax(logits[i], -1)[t])
                count += 1
    return math.exp(nll / count)


def test_image_answer_perplexity_equals_a_row_by_row_computation(page, testbed_root: Path) -> None:
    """``ppl_image`` of the dense model and of every AIMER row (an independent plan) against the physically pruned
    model's image answers scored one row at a time."""
    from lightprune.testbed.vqa_models import vqa_testbed

    _, data = page
    mllm = data["mllm"]
    model = lp.load_pruned(vqa_testbed("mllm-moe-canvas-micro", testbed_root) / "model").eval()
    aimer = lp.score_weights(model, "aimer")
    assert mllm["dense"]["ppl_image"] == pytest.approx(
        _image_answer_ppl_of_pruned(model, lp.select_experts(aimer, 0.0), testbed_root), rel=1e-4)
    rows = [r for r in mllm["rows"] if r["criterion"] == "aimer"]
    assert len(rows) == 2
    for row in rows:
        expected = _image_answer_ppl_of_pruned(model, lp.select_experts(aimer, row["ratio"]), testbed_root)
        assert row["metrics"]["ppl_image"] == pytest.approx(expected, rel=1e-4)


def test_anti_orderings_prune_what_their_criterion_keeps(page, testbed_root: Path) -> None:
    _, data = page
    for part in ("text", "mllm"):
        names = {r["criterion"] for r in data[part]["rows"]}
        assert {"anti_reap", "anti_aimer", "anti_router_sensitivity"} <= names, part
    model = lp.load_pruned(text_testbed("micro", testbed_root) / "model").eval()
    aimer = lp.score_weights(model, "aimer")
    for row in (r for r in data["text"]["rows"] if r["criterion"] == "anti_aimer"):
        plan = lp.select_experts(type(aimer)({l: -v for l, v in aimer.items()}, aimer.limits), row["ratio"])
        for layer, pruned in plan.pruned().items():  # the highest AIMER scores of every layer
            order = sorted(range(len(aimer[layer])), key=lambda e: float(aimer[layer][e]))
            assert sorted(pruned) == sorted(order[len(order) - len(pruned):])
        assert row["metrics"]["ppl"] == pytest.approx(_ppl_of_pruned(model, plan, testbed_root, 4), rel=1e-4)


def test_every_uniform_row_prunes_the_ratio_of_every_layer_and_global_rows_the_ratio_overall(page) -> None:
    _, data = page
    for part in ("text", "mllm"):
        for row in data[part]["rows"]:
            counts = row["pruned_per_layer"]
            experts = 8  # the micro testbeds' experts per layer
            if row["allocation"] == "uniform":
                assert set(counts.values()) == {int(row["ratio"] * experts)}, (part, row["criterion"])
            else:
                assert sum(counts.values()) == round(row["ratio"] * experts * len(counts)), row["criterion"]
    names = {r["criterion"] for r in data["mllm"]["rows"]}
    assert {"frequency", "seer", "ean", "reap", "routing_kl", "delta_h", "maep_global", "maep_uniform", "aimer",
            "magnitude", "router_norm", "router_sensitivity", "anti_reap", "hc_smoe", "m_smoe"} <= names
    for part in ("text", "mllm"):  # the merging baselines: every layer merged down to the same share, per ratio
        merges = [r for r in data[part]["rows"] if r["allocation"] == "merge"]
        assert sorted((r["criterion"], r["ratio"]) for r in merges) == \
            sorted((m, ratio) for m in ("hc_smoe", "m_smoe") for ratio in (0.25, 0.5))
        assert all(set(r["pruned_per_layer"].values()) == {int(r["ratio"] * 8)} for r in merges)


def test_random_spread_and_the_page_carry_the_measured_numbers(page) -> None:
    out, data = page
    md = (out / "RESULTS.md").read_text()
    for part, metric in (("text", "ppl"), ("mllm", "ppl_text")):
        for ratio, entry in data[part]["random"].items():
            values = [s[metric] for s in entry["seeds"]]
            assert len(values) == 2 and values[0] != values[1]
            summary = entry["summary"][metric]
            assert summary["mean"] == pytest.approx(statistics.fmean(values))
            assert summary["std"] == pytest.approx(statistics.stdev(values))
            assert (summary["min"], summary["max"]) == (min(values), max(values))
    row = next(r for r in data["text"]["rows"] if r["criterion"] == "reap" and r["ratio"] == 0.5)
    dense = data["text"]["dense"]["ppl"]
    assert retention("ppl", row["metrics"]["ppl"], dense) == pytest.approx(100 * dense / row["metrics"]["ppl"])
    reap_line = next(line for line in md.splitlines() if line.startswith("| reap | uniform |"))
    assert f"{row['metrics']['ppl']:.1f}" in reap_line
    retention_line = next(line for line in md.splitlines() if line.startswith("| reap | ") and "uniform" not in line)
    assert f"{retention('ppl', row['metrics']['ppl'], dense):.1f}" in retention_line
    for png in ("text_ppl_retention.png", "mllm_image_retention.png", "mllm_text_retention.png",
                "mllm_pruned_per_layer.png"):
        assert (out / "results" / png).read_bytes()[:4] == b"\x89PNG"
    rho = data["text"]["proxy_rho"]["all"]["delta_h"]
    assert rho["mean"] is None or -1.0 <= rho["mean"] <= 1.0
    assert set(data["mllm"]["stability"]["criteria"]["delta_h"]) == {"text", "vision", "vision_low_attn",
                                                                   "vision_high_attn"}


def test_the_page_shows_each_moe_testbeds_routing_balance(page) -> None:
    """Per MoE layer the least routed expert's share and the normalised entropy of the calibration routing, against
    the goal (share x E >= 0.25, entropy >= 0.95), as recorded."""
    out, data = page
    text = (out / "RESULTS.md").read_text()
    for part in ("text", "mllm"):
        balance = data[part]["routing_balance"]
        layers = balance["layers"]
        assert set(layers) == set(data[part]["rows"][0]["pruned_per_layer"])  # every MoE layer
        for layer, v in layers.items():
            assert 0.0 <= v["min_share"] <= 1 / 8 and v["min_share_x_experts"] == pytest.approx(8 * v["min_share"])
            assert 0.0 < v["entropy"] <= 1.0 + 1e-12
            assert f"| {layer} | {v['min_share']:.4f} | {v['min_share_x_experts']:.2f} | {v['entropy']:.3f} |" in text
        assert balance["met"] == all(v["min_share_x_experts"] >= 0.25 and v["entropy"] >= 0.95 for v in layers.values())


def test_the_page_states_every_check_with_its_verdict_and_seeds(page) -> None:
    """One claims section, the seeded one: a line per check with its verdict and every seed's figures; the checks of
    a testbed not measured in the run (MWOP here) are on it as not measured."""
    out, data = page
    lines = (out / "RESULTS.md").read_text().splitlines()
    assert "## Claims checked" not in lines
    for c in data["claims"]:
        line = next(x for x in lines if x.startswith(f"| {c['paper']} | {c['claim']} | {c['testbed']} | "
                                                      f"{c['metric']} retention "))
        assert c["verdict"] in line
        for s in c["seeds"]:
            assert f"{s['paired_diff']:+.1f} [{s['paired_ci'][0]:+.1f}, {s['paired_ci'][1]:+.1f}]" in line
    assert {c["verdict"] for c in data["claims"] if c["testbed"] == "mwop"} == {"not measured"}
    assert "text MoE: seed 0 of the 2 its checks are over; multimodal MoE: seed 0 of the 2" in "\n".join(lines)


def test_the_claims_over_testbed_seeds_follow_from_the_measured_numbers(page) -> None:
    """Every check of CLAIM_CHECKS has one record per testbed seed (micro: seeds 0 and 1, each a testbed trained
    from its seed; router sensitivity one per fit seed too); seed 0's records recomputed from its table (the p-value from the random plans' retentions, the
    paired difference's point value from the rows' metrics) and the verdict by the rule from the records alone."""
    from lightprune.quality.claims import CLAIM_CHECKS, CLOSED_FORM, NOT_JUDGED, claim_verdict, comparison_verdict

    out, data = page
    claims = data["claims"]
    assert [(c["paper"], c["claim"], c["testbed"], c["criterion"], c["rival"], c["metric"]) for c in claims] == \
        list(CLAIM_CHECKS)

    def kept(part, criterion, metric):
        row = next(r for r in data[part]["rows"] if r["criterion"] == criterion and r["ratio"] == 0.5)
        return retention(metric, row["metrics"][metric], data[part]["dense"][metric])

    measured = 0
    for c in claims:
        if c["verdict"] == "not measured":  # a seed without a record: MAEP's global row when its closed-form
            assert len(c["seeds"]) < 2      # alpha leaves [0, 1], a metric whose dense value is 0 (micro testbeds)
            continue
        measured += 1
        fits = c["criterion"].endswith("*")  # router sensitivity: a record per (testbed seed, fit seed)
        assert [s["testbed_seed"] for s in c["seeds"]] == ([0, 0, 1, 1] if fits else [0, 1])
        assert not fits or [s["fit_seed"] for s in c["seeds"]] == [0, 1, 0, 1]
        first, metric, part = c["seeds"][0], c["metric"], c["testbed"]
        value = kept(part, c["criterion"].rstrip("*"), metric)
        if c["rival"] is None:
            randoms = [retention(metric, s[metric], data[part]["dense"][metric])
                       for s in data[part]["random"]["0.5"]["seeds"]]
            assert first["null_size"] == len(randoms) == 2
            assert first["p_value"] == (1 + sum(r >= value for r in randoms)) / (1 + len(randoms))
            assert first["paired_diff"] == pytest.approx(value - sum(randoms) / len(randoms), abs=1e-9)
            verdict = claim_verdict(c["seeds"])
        else:
            assert first["paired_diff"] == pytest.approx(value - kept(part, c["rival"], metric), abs=1e-9)
            verdict = comparison_verdict(c["seeds"])
        assert all(s["paired_ci"][0] <= s["paired_diff"] <= s["paired_ci"][1] for s in c["seeds"])
        diffs = [s["paired_diff"] for s in c["seeds"]]
        assert c["over_seeds"]["mean"] == pytest.approx(statistics.fmean(diffs))
        unsure = [t["maep_alpha_interval"]["a_excludes_zero"] for t in _seed_tables(out, "mllm")]
        if c["criterion"] == CLOSED_FORM and not all(unsure):  # alpha is noise on a seed: not judged
            assert c["verdict"].startswith(NOT_JUDGED)
        else:
            assert c["verdict"] == verdict
    assert measured >= 4
    page_text = (out / "RESULTS.md").read_text()
    assert "## Claims over testbed seeds" in page_text


def _seed_tables(out: Path, part: str) -> list[dict]:
    return [json.loads(p.read_text())["tables"] for p in sorted((out / "results" / "seeds").glob(f"{part}-seed*.json"))]


def test_every_figure_is_recomputed_from_the_seed_files_alone(page) -> None:
    """scripts/recompute_results.py (numpy, no lightprune statistics) agrees with every p-value, paired difference
    and interval of both parts' seed files and every claim's interval over seeds; a changed row sum is caught; the
    page's results.json keeps no per-row records."""
    import importlib.util
    import shutil

    out, data = page
    spec = importlib.util.spec_from_file_location("recompute_results", REPO / "scripts" / "recompute_results.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    checker = script.Checker()
    for path in sorted((out / "results" / "seeds").glob("*.json")):
        assert script.check_seed(path, checker) is not None, path
    script.check_claims(out / "results", checker)
    assert checker.bad == [] and checker.checked > 500
    assert all("records" not in (data[part] or {}) for part in ("text", "mllm", "mwop"))
    # one random plan's first row changed by a thousandth: its ratio's p-values or differences disagree
    broken = out.parent / f"{out.name}-broken"
    shutil.copytree(out, broken)
    path = broken / "results" / "seeds" / "text-seed0.json"
    kept = json.loads(path.read_text())
    plans = kept["tables"]["records"]["metrics"]["ppl"]["plans"]
    numerator = script.unpack(plans["random:0@0.5"]).astype("<f4")
    numerator[0] *= 1.001
    from lightprune.quality.records import pack

    plans["random:0@0.5"] = pack(torch.from_numpy(numerator.astype("float64")))
    path.write_text(json.dumps(kept))
    assert script.main(["--results", str(broken / "results")]) == 1


def test_maep_alpha_is_on_the_page_with_its_interval_on_every_seed(page) -> None:
    """Every multimodal seed's alpha, a and b with their bootstrap intervals (the point a, b the closed form's on the
    whole calibration set) and the rows of the pre-registered rules on every seed."""
    from lightprune.quality.expert_quality import FIXED_ALPHAS

    out, data = page
    lines = (out / "RESULTS.md").read_text().split("## MAEP's alpha over testbed seeds")[1].splitlines()
    tables = _seed_tables(out, "mllm")
    assert [m["testbed_seed"] for m in data["maep"]] == [t["testbed"]["seed"] for t in tables] == [0, 1]
    for table, shown in zip(tables, data["maep"]):
        interval, report = table["maep_alpha_interval"], table["maep_alpha_report"]
        assert interval["a"] == pytest.approx(report["a"], abs=1e-6)
        assert interval["b"] == pytest.approx(report["b"], abs=1e-6)
        closed = report["closed_form"]
        assert table["maep_alpha_clamped"] == pytest.approx(min(1.0, max(0.0, closed)))
        assert interval["a_excludes_zero"] == (interval["a_ci"][0] > 0 or interval["a_ci"][1] < 0)
        row = next(x for x in lines if x.startswith(f"| {shown['testbed_seed']} | "))
        assert f"{interval['a']:.3f} [{interval['a_ci'][0]:.3f}, {interval['a_ci'][1]:.3f}]" in row
        names = {r["criterion"] for r in table["rows"] if r["ratio"] == 0.5}
        assert {"maep_global", "delta_h_text_global", "reap_global",
                *(f"maep_global_alpha{a:g}" for a in FIXED_ALPHAS)} <= names


def test_each_seeds_tables_are_kept_so_a_stopped_run_resumes(tmp_path: Path, capsys) -> None:
    """The tables of a measured seed come back for a run with the same settings (as JSON reads them), not for other
    settings nor for a testbed of another spec (a preset whose recipe changed), nor with --fresh, and a kept file
    not used says why; the file is replaced whole (no partial file is left to read)."""
    kept = _script().SeedTables(tmp_path / "seeds")
    settings = {"preset": "micro", "ratios": [0.25, 0.5], "random_seeds": 8, "testbed_seed": 1}
    spec = dataclasses.replace(VQA_TESTBEDS["mllm-moe-micro"], seed=1)
    recorded = json.loads(json.dumps(dataclasses.asdict(spec)))  # as training.json keeps it
    tables = {"rows": [{"criterion": "aimer", "ratio": 0.5}], "dense": {"ppl": 3.5}, "random": {0.5: {"seeds": []}},
              "testbed": {"spec": recorded}}
    assert kept.get("text", settings) is None
    back = kept.put("text", settings, tables)
    assert back == json.loads(json.dumps(tables)) and back["random"] == {"0.5": {"seeds": []}}
    assert kept.get("text", settings) == back and kept.get("mllm", settings) is None
    capsys.readouterr()
    assert kept.get("text", {**settings, "random_seeds": 50}) is None
    assert "text-seed1.json: not used, measured under other settings: random_seeds 8 there, 50 in this run" in \
        capsys.readouterr().err
    assert kept.get("text", {**settings, "ratios": [0.5]}) is None
    assert "ratios [0.25, 0.5] there, [0.5] in this run" in capsys.readouterr().err
    assert kept.get("text", settings, spec) == back
    assert kept.get("text", settings, dataclasses.replace(spec, steps=7)) is None
    assert f"trained from another spec (digest {spec.digest()}" in capsys.readouterr().err
    assert kept.get("text", settings, dataclasses.replace(spec, data={**spec.data, "tasks": ["digit"]})) is None
    old = {k: v for k, v in recorded.items() if k != "max_grad_norm"}  # recorded before the field was added
    kept.put("text", settings, {**tables, "testbed": {"spec": old}})
    assert kept.get("text", settings, dataclasses.replace(spec, max_grad_norm=None)) is not None
    assert kept.get("text", settings, spec) is None  # the same recipe with clipping: another testbed
    assert _script().SeedTables(tmp_path / "seeds", fresh=True).get("text", settings) is None
    assert sorted(p.name for p in (tmp_path / "seeds").iterdir()) == ["text-seed1.json"]


def test_every_criterion_is_judged_against_random_over_the_seeds(page) -> None:
    """The context of the claims: each row at 50% of the first seed's tables, its records over the seeds (seed 0's
    the row's own standing) and the verdict by the claims' rule; on the page."""
    from lightprune.quality.claims import claim_verdict

    out, data = page
    lines = (out / "RESULTS.md").read_text().splitlines()
    for part, metric in (("text", "ppl"), ("mllm", "acc_image"), ("mllm", "ppl_text")):
        mine = [c for c in data["criteria"] if c["testbed"] == part and c["metric"] == metric]
        rows = [r for r in data[part]["rows"] if r["ratio"] == 0.5 and metric in r["standing"]]
        assert [c["criterion"] for c in mine] == [r["criterion"] for r in rows]
        assert rows or part == "mllm"  # micro MLLM: a metric whose dense value is 0 has no standing
        for c, row in zip(mine, rows):
            assert c["seeds"][0] == row["standing"][metric]
            if [s["testbed_seed"] for s in c["seeds"]] == [0, 1]:
                assert c["verdict"] == claim_verdict(c["seeds"])
            else:  # a row the other seed's tables lack (micro: MAEP's global row when its alpha leaves [0, 1])
                assert c["verdict"] == "not measured" and len(c["seeds"]) == 1
            assert any(x.startswith(f"| {part} | {c['criterion']} | {c['allocation']} | {metric} retention @50% | "
                                    f"{c['verdict']} |") for x in lines)

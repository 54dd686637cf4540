"""The quality tables of docs/RESULTS.md: every expert criterion on the trained testbeds, side by side.

`text_tables` (the text MoE testbed) and `mllm_tables` (the Qwen3-VL-MoE-style testbed)
each return a JSON-able dict: the dense model's metrics, every criterion at every ratio
(`lightprune.quality.expert_quality`), random over seeds with its spread, the per-layer rho of
the Delta-H / REAP / routing-KL proxies against the ground-truth KL, and the cross-dataset stability
of the rankings (text: prose vs code calibration; multimodal: digits vs charts, per token subset).
Evaluation splits are never the calibration split.

Metrics. Text testbed, on the test split: perplexity overall and per domain (every token) and
next-token accuracy. Multimodal testbed, on the val split: answer accuracy per image task (every
answer token right, teacher forced, end-of-turn markers not counted), the image answers' perplexity
beside it (their loss) and the perplexity of the text rows' completions. Both evaluations return their
per-row sums, so every row gets bootstrap intervals of its retention (`lightprune.quality.intervals`).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import torch

from lightprune.core.batch import model_inputs
from lightprune.core.jsonio import read_json
from lightprune.data.rows import read_jsonl
from lightprune.data.tokenizer import end_of_turn_ids
from lightprune.experts.calibration import DEFAULT_CRITERIA
from lightprune.quality.alpha_interval import alpha_interval
from lightprune.quality.expert_quality import (
    FIXED_ALPHAS,
    MERGE_STATISTICS,
    expert_merges,
    expert_quality,
    expert_rankings,
    maep_alpha,
    proxy_rho,
    router_sensitivity,
    stability,
)
from lightprune.quality.intervals import ROW_SUMS, metric_value
from lightprune.quality.width_quality import mwop_quality
from lightprune.quality.width_recovery import mwop_recovery
from lightprune.testbed.text_corpus import build_text_corpus, rows_by_domain
from lightprune.testbed.text_moe import TEXT_TESTBEDS, corpus_datamodule, instruction_datamodule, text_testbed
from lightprune.testbed.training import encode_batches, next_token_row_sums
from lightprune.testbed.vqa_models import VQA_TESTBEDS, datamodule, vqa_testbed
from lightprune.width.retention import answer_row_sums

__all__ = ["MLLM_COMPARISONS", "PART_PRESETS", "TEXT_COMPARISONS", "mllm_tables", "mwop_tables", "testbed_spec",
           "text_tables"]


def _text_batches(dm, path, rows: int | None) -> list[dict[str, torch.Tensor]]:
    return encode_batches(dm, read_jsonl(path, limit=rows))


def _inputs(batches) -> list[dict[str, torch.Tensor]]:
    """Calibration batches as the model takes them (no labels, no task ids)."""
    return [model_inputs(b) for b in batches]


def _testbed_record(folder, preset: str, quality: str) -> dict[str, Any]:
    """What the page says about the testbed: its training.json's size, time, spec and ``quality`` figure."""
    training = read_json(folder / "training.json", "testbed training")
    return {"preset": preset, "folder": str(folder), "parameters": training["parameters"],
            "train_seconds": training["train_seconds"], "spec": training["spec"], quality: training[quality]}


def _with_row_sums(sums: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, Any]:
    """Each metric's value from its row sums (`metric_value`), and the sums
    themselves under `ROW_SUMS`."""
    out: dict[str, Any] = {m: float(metric_value(m, *s)) for m, s in sums.items()}
    out[ROW_SUMS] = sums
    return out


def _next_token_sums(sums: dict, suffix: str, nll: torch.Tensor, right: torch.Tensor, count: torch.Tensor) -> None:
    sums[f"ppl{suffix}"], sums[f"acc{suffix}"] = (nll, count), (right, count)


def routing_balance_record(stats) -> dict[str, Any]:
    """Per MoE layer, how balanced the calibration tokens' routing is
    (`lightprune.finetune.balance.routing_balance` of the frequency counts over all tokens), with the goal it
    is held to: every expert at least 1/(4E) of a layer's routing, normalised entropy at least 0.95."""
    from lightprune.finetune.balance import routing_balance

    layers = {str(layer): routing_balance(counts) for layer, counts in stats.raw("frequency", "all").items()}
    return {"layers": layers, "goal": {"min_share_x_experts": 0.25, "entropy": 0.95},
            "met": all(v["min_share_x_experts"] >= 0.25 and v["entropy"] >= 0.95 for v in layers.values())}


#: each paper's own comparators: (criterion, rival, metric) pairs measured on the same rows (claims.py)
TEXT_COMPARISONS = tuple((c, r, "ppl") for c in ("aimer", "router_sensitivity") for r in ("magnitude", "router_norm")) \
    + (("router_sensitivity", "anti_router_sensitivity", "ppl"),)
_MLLM_METRICS = ("acc_image", "ppl_image", "ppl_text")
#: MAEP's rows against REAP, and the pairs that credit a win to the allocation or to the modality term (the paper's
#: own ablation, arXiv 2611.05927, section 6.3.1)
MLLM_COMPARISONS = tuple((c, r, m) for c in ("delta_h", "maep_global") for r in ("reap", "routing_kl")
                         for m in _MLLM_METRICS) \
    + tuple((c, r, m) for c, r in (("maep_global", "delta_h_text_global"), ("maep_global", "reap_global"),
                                   ("reap_global", "reap"), ("delta_h_text_global", "reap"),
                                   *((f"maep_global_alpha{a:g}", "reap") for a in FIXED_ALPHAS))
            for m in _MLLM_METRICS) \
    + (("aimer", "magnitude", "acc_image"), ("aimer", "router_norm", "acc_image"))


#: the testbed presets each part's tables are measured on
PART_PRESETS: dict[str, Mapping[str, Any]] = {"text": TEXT_TESTBEDS, "mllm": VQA_TESTBEDS, "mwop": VQA_TESTBEDS}


def testbed_spec(part: str, preset: str, seed: int | None = None) -> Any:
    """The spec of the testbed ``part``'s tables (``text``, ``mllm``, ``mwop``) on ``preset`` are measured on, with
    ``seed``: the recipe trained from that seed."""
    return _seeded(PART_PRESETS[part], preset, seed)[0]


def _seeded(table: Mapping[str, Any], preset: str, seed: int | None) -> tuple[Any, Any]:
    """(spec, what the testbed function takes): the preset's, or its recipe trained from ``seed`` (another testbed
    of the same recipe, passed as a spec)."""
    spec = table[preset]
    if seed is None or seed == spec.seed:
        return spec, preset
    seeded = dataclasses.replace(spec, seed=int(seed))
    return seeded, seeded


def text_tables(preset: str = "full", root: str | os.PathLike | None = None, *, ratios=(0.25, 0.5),
                random_seeds: int = 50, calibration_rows: int = 64, eval_rows: int = 128, kl_rows: int = 16,
                sensitivity_steps: int = 500, sensitivity_fits: int = 3, progress: bool = True,
                testbed_seed: int | None = None) -> dict[str, Any]:
    """Every criterion on the text testbed ``preset`` (trained first when not cached; ``testbed_seed``: the same
    recipe trained from that seed), each row's standing against the ``random_seeds`` random plans (the null) and
    against its paper's comparators (`TEXT_COMPARISONS`). Router sensitivity is fitted ``sensitivity_fits``
    times (fit seeds 0, 1, ...: rows ``router_sensitivity``, ``router_sensitivity_fit1``, ...), so that its claim
    is judged over the fit's randomness too."""
    import lightprune as lp


    spec, which = _seeded(PART_PRESETS["text"], preset, testbed_seed)
    folder = text_testbed(which, root, progress=progress)
    corpus = build_text_corpus(spec.corpus, root)
    model = lp.load_pruned(folder / "model").eval()
    dm = corpus_datamodule(spec, corpus)
    test_rows = rows_by_domain(corpus.files["test"])
    eval_batches = {d: encode_batches(dm, rows[: eval_rows // 2]) for d, rows in test_rows.items()}
    calib = {"mixed": corpus.files["calibration"], "prose": corpus.files["calibration-prose"],
             "code": corpus.files["calibration-code"]}
    calib_batches = {k: _inputs(_text_batches(dm, p, calibration_rows)) for k, p in calib.items()}

    def evaluate(m: torch.nn.Module) -> dict[str, Any]:
        sums: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        rows = {domain: next_token_row_sums(m, batches) for domain, batches in eval_batches.items()}
        for domain, (nll, right, count) in rows.items():
            _next_token_sums(sums, f"_{domain}", nll, right, count)
        _next_token_sums(sums, "", *(torch.cat([r[i] for r in rows.values()]) for i in range(3)))
        return _with_row_sums(sums)

    stats = lp.collect_expert_stats(model, calib_batches["mixed"], subsets=("all",), progress=progress,
                                    criteria=DEFAULT_CRITERIA + MERGE_STATISTICS)
    extra = {}
    # router sensitivity ("Router Sensitivity Under Lightweight Fine-Tuning Identifies Prunable Experts in
    # Mixture-of-Experts Models", section 4) adapts on instruction data, not on the pretraining text
    if sensitivity_steps:
        with tempfile.TemporaryDirectory() as tmp:
            for fit in range(sensitivity_fits):
                name = "router_sensitivity" + (f"_fit{fit}" if fit else "")
                extra[name] = router_sensitivity(str(folder / "model"), instruction_datamodule(spec, corpus, tmp),
                                                 steps=sensitivity_steps, seed=fit, progress=progress)
    rankings = expert_rankings(model, stats, extra=extra)
    result = expert_quality(model, rankings, evaluate, ratios=ratios, random_seeds=random_seeds, progress=progress,
                            merges=expert_merges(stats), standing_metrics=("ppl",), comparisons=TEXT_COMPARISONS,
                            testbed_seed=spec.seed)
    kl_batches = calib_batches["mixed"][: max(1, kl_rows // dm.batch_size)]
    kl_stats = lp.collect_expert_stats(model, kl_batches, subsets=("all",), progress=progress)
    result["proxy_rho"] = proxy_rho(model, kl_batches, kl_stats, progress=progress)
    by_domain = {d: lp.collect_expert_stats(model, calib_batches[d], subsets=("all",), progress=progress)
                 for d in ("prose", "code")}
    result["stability"] = {"pair": ["prose", "code"], "criteria": stability(by_domain["prose"], by_domain["code"])}
    result["testbed"] = {**_testbed_record(folder, preset, "held_out_perplexity"), "seed": spec.seed}
    result["routing_balance"] = routing_balance_record(stats)
    result["router_sensitivity_steps"] = sensitivity_steps
    result["router_sensitivity_fits"] = sensitivity_fits if sensitivity_steps else 0
    result["router_sensitivity_data"] = ("instruction rows (questions and answers on Python's documentation topics, "
                                         "Testbed VQA's text task, loss on the answer only)")
    return result


def mllm_tables(preset: str = "mllm-moe-canvas-full", root: str | os.PathLike | None = None, *, ratios=(0.25, 0.5),
                random_seeds: int = 50, kl_rows: int = 16, sensitivity_steps: int = 500,
                progress: bool = True, testbed_seed: int | None = None,
                alpha_resamples: int = 1000) -> dict[str, Any]:
    """Every criterion, MAEP's rows included (`maep_rankings`), on the
    multimodal MoE testbed ``preset`` (``testbed_seed``: the same recipe trained from that seed), with each row's
    standing against the random plans and the comparators of `MLLM_COMPARISONS`, and MAEP's closed-form
    alpha with its bootstrap interval over the calibration samples (``alpha_resamples`` resamples:
    `alpha_interval`)."""
    import lightprune as lp


    spec, which = _seeded(PART_PRESETS["mllm"], preset, testbed_seed)
    folder = vqa_testbed(which, root, progress=progress)
    model = lp.load_pruned(folder / "model").eval()
    dm = datamodule(spec, str(folder / "model"), root)
    dm.setup("fit")
    names = dm.task_names
    image_tasks = [t for t in names if t != "text"]
    val_image = list(dm.dataloader("val", tasks=image_tasks))
    val_text = list(dm.dataloader("val", tasks=["text"])) if "text" in names else []

    calib_all = _inputs(dm.dataloader("calibration"))
    calib_digits = _inputs(dm.dataloader("calibration", tasks=["digit"]))
    calib_charts = _inputs(dm.dataloader("calibration", tasks=[t for t in image_tasks if t.startswith("chart")]))

    end_ids = end_of_turn_ids(dm)

    def evaluate(m: torch.nn.Module) -> dict[str, Any]:
        rows = answer_row_sums(m, val_image, len(names), end_ids)
        image = torch.zeros_like(rows["task"], dtype=torch.bool)
        sums: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for t in image_tasks:
            mine = rows["task"] == names.index(t)
            image |= mine
            sums[f"acc_{t}"] = (rows["exact"][mine], rows["answered"][mine])
        # every image row pooled: with the val split's equal rows per task, the mean of the tasks' accuracies
        sums["acc_image"] = (rows["exact"][image], rows["answered"][image])
        # the answers' loss beside their accuracy: perplexity of the image rows' answer tokens (teacher forced)
        sums["ppl_image"] = (rows["nll"][image], rows["tokens"][image])
        if val_text:
            _next_token_sums(sums, "_text", *next_token_row_sums(m, val_text))
        return _with_row_sums(sums)

    subsets = ("all", "text", "vision", "vision_low_attn", "vision_high_attn")
    stats = lp.collect_expert_stats(model, calib_all, subsets=subsets, progress=progress,
                                    criteria=DEFAULT_CRITERIA + MERGE_STATISTICS)
    extra = {}
    if sensitivity_steps:
        checkpoint = str(folder / "model")
        extra["router_sensitivity"] = router_sensitivity(checkpoint, datamodule(spec, checkpoint, root),
                                                         steps=sensitivity_steps, progress=progress)
    rankings = expert_rankings(model, stats, maep=True, extra=extra)
    result = expert_quality(model, rankings, evaluate, ratios=ratios, random_seeds=random_seeds, progress=progress,
                            merges=expert_merges(stats), standing_metrics=("acc_image", "ppl_image", "ppl_text"),
                            comparisons=MLLM_COMPARISONS, testbed_seed=spec.seed)
    alpha = maep_alpha(stats)
    result["maep_alpha"], result["maep_alpha_error"] = alpha["value"], alpha["error"]
    result["maep_alpha_clamped"] = alpha["clamped"]  # the maep_global row's alpha
    result["maep_alpha_report"] = alpha["report"]  # the rhos alpha comes from
    one_by_one = datamodule(spec, str(folder / "model"), root, batch_size=1)
    one_by_one.setup("fit")
    result["maep_alpha_interval"] = alpha_interval(model, _inputs(one_by_one.dataloader("calibration")),
                                                   resamples=alpha_resamples, progress=progress)
    kl_batches = calib_all[: max(1, kl_rows // spec.batch_size)]
    kl_stats = lp.collect_expert_stats(model, kl_batches, subsets=("all", "text", "vision"), progress=progress)
    result["proxy_rho"] = proxy_rho(model, kl_batches, kl_stats, subsets=("all", "text", "vision"), progress=progress)
    a = lp.collect_expert_stats(model, calib_digits, subsets=subsets[1:], progress=progress)
    b = lp.collect_expert_stats(model, calib_charts, subsets=subsets[1:], progress=progress)
    result["stability"] = {"pair": ["digits", "charts"], "criteria": stability(a, b, ("delta_h", "reap"))}
    result["testbed"] = {**_testbed_record(folder, preset, "val_answer_accuracy"), "seed": spec.seed}
    result["routing_balance"] = routing_balance_record(stats)
    result["router_sensitivity_steps"] = sensitivity_steps
    return result


def mwop_tables(preset: str = "dense-mllm-full", root: str | os.PathLike | None = None, *, random_seeds: int = 50,
                recovery_epochs: int = 1, recovery_seeds: int = 3, progress: bool = True,
                testbed_seed: int | None = None, **kwargs: Any) -> dict[str, Any]:
    """MWOP at the paper's operating points vs a null of ``random_seeds`` random masks on the dense multimodal
    testbed ``preset`` (``testbed_seed``: the same recipe trained from that seed), training-free, and
    (``recovery_epochs`` > 0) after recovery against ``recovery_seeds`` random plans given the same recovery."""
    import lightprune as lp


    spec, which = _seeded(PART_PRESETS["mwop"], preset, testbed_seed)
    folder = vqa_testbed(which, root, progress=progress)
    model = lp.load_pruned(folder / "model").eval()
    dm = datamodule(spec, str(folder / "model"), root)
    dm.setup("fit")
    result = mwop_quality(model, dm, random_seeds=random_seeds, testbed_seed=spec.seed, progress=progress,
                          **kwargs)
    if recovery_epochs:
        result["recovery"] = mwop_recovery(model, dm, result, random_seeds=recovery_seeds, epochs=recovery_epochs,
                                           testbed_seed=spec.seed, progress=progress)
    result["testbed"] = {**_testbed_record(folder, preset, "val_answer_accuracy"), "seed": spec.seed}
    return result

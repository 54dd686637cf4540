"""What lightprune publishes is standard JSON: a NaN or infinite float (a perplexity that overflowed) is written as
null in report.json and in an export's manifest, never as the NaN / Infinity Python's json writes by default."""

from __future__ import annotations

import json
import math
from pathlib import Path

import lightprune as lp
from lightprune.export.result import record_evaluation
from lightprune.reporting.report import merge_report, write_report
from lightprune.testing.tiny import tiny_model


def _strict(path: Path):
    def refuse(constant: str):
        raise AssertionError(f"{path.name} holds {constant}")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_report_json_writes_a_non_finite_figure_as_null(tmp_path: Path) -> None:
    write_report({"perplexity": math.inf, "rows": [1.5, -math.inf, {"nan": math.nan}], "ok": 2}, tmp_path / "r.json")
    assert _strict(tmp_path / "r.json") == {"perplexity": None, "rows": [1.5, None, {"nan": None}], "ok": 2}
    merge_report({"evaluation": {"after": {"perplexity": math.inf}}}, tmp_path / "r.json")
    assert _strict(tmp_path / "r.json")["evaluation"] == {"after": {"perplexity": None}}


def test_the_export_manifest_is_standard_json_whatever_the_card_holds(tmp_path: Path) -> None:
    model = tiny_model("qwen3_moe")
    plan = lp.select_experts(lp.score_weights(model, "aimer"), 0.5)
    lp.export_pruned(model, plan, tmp_path / "out", card={"evaluation": {"before": {"perplexity": math.inf}}})
    assert _strict(tmp_path / "out" / "lightprune_export.json")["evaluation"] == {"before": {"perplexity": None}}
    record_evaluation(tmp_path / "out", {"after": {"perplexity": math.nan, "loss": 3.5}})  # Evaluate after export
    assert _strict(tmp_path / "out" / "lightprune_export.json")["evaluation"] == {"after": {"perplexity": None,
                                                                                            "loss": 3.5}}

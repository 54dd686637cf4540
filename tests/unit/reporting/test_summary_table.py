"""The summary table of a run: the export's figures, and Evaluate's perplexity before and after with the
retention when the run evaluated."""

from __future__ import annotations

from rich.console import Console

from lightprune.reporting.report import summary_table

REPORT = {"criterion": "reap", "source": "testbed:text-small", "experts_before": 64, "experts_after": 32,
          "params_before": 3876224, "params_after": 2299264, "checkpoint_bytes_before": None,
          "checkpoint_bytes_after": 9216000, "kept_per_layer": {"0": 8, "1": 8}, "max_abs_diff": 5.7e-6,
          "seconds_scoring": 0.02, "seconds_export": 0.5}


def _rows(table) -> dict[str, list[str]]:
    console = Console(record=True, width=200)
    console.print(table)
    rows = {}
    for line in console.export_text().splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) == 3 and cells[0]:
            rows[cells[0]] = cells[1:]
    return rows


def test_the_table_has_the_exports_figures() -> None:
    rows = _rows(summary_table(REPORT))
    assert rows["routed experts"] == ["64", "32"]
    assert rows["parameters"] == ["3,876,224", "2,299,264"]
    assert rows["kept per layer"] == ["", "0:8 1:8"]
    assert not any(name.startswith("perplexity") for name in rows)


def test_the_evaluation_adds_perplexity_and_its_retention() -> None:
    evaluation = {"split": "val", "before": {"perplexity": 80.0}, "after": {"perplexity": 125.0}}
    rows = _rows(summary_table(REPORT, evaluation))
    assert rows["perplexity (val)"] == ["80", "125"]
    assert rows["perplexity retention (before / after)"] == ["", "64.0%"]  # 80 / 125
    rows = _rows(summary_table(REPORT, {"split": "test", "after": {"perplexity": 125.0}}))
    assert rows["perplexity (test)"] == ["-", "125"] and "perplexity retention (before / after)" not in rows

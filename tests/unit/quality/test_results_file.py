"""What results.json keeps of each part (quality/results_page.page_tables): the page's tables, not the per-row
records, so that the file does not grow with every re-measure."""

from __future__ import annotations


def test_the_pages_file_keeps_no_records() -> None:
    """results.json's tables (results_page.page_tables): the per-row records (MWOP's recovery has its own) stay in
    the seed files; nothing else changes, and the input is not changed."""
    from lightprune.quality.results_page import page_tables

    taylor = {"method": "taylor", "plan": {"mask": [1, 0]}, "atr": 90.0}
    random_row = {"method": "random", "seeds": [0, 1], "per_seed": [{"seed": s, "atr": 80.0 + s} for s in (0, 1)]}
    recovery = {"epochs": 1, "rows": [taylor], "records": {"plans": {}}}
    part = {"rows": [taylor, random_row], "records": {"metrics": {}}, "testbed": {"seed": 0}, "recovery": recovery}
    kept = page_tables(part)
    assert kept == {"rows": [taylor, random_row], "testbed": {"seed": 0}, "recovery": {"epochs": 1, "rows": [taylor]}}
    assert "records" in part and "records" in part["recovery"]  # the input is not changed
    assert page_tables(None) is None

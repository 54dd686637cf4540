"""What results.json keeps of each part (quality/results_page.page_tables): the page's tables, not the per-row
records nor the random plans' masks, so that the file does not grow with every re-measure."""

from __future__ import annotations


def test_the_pages_file_keeps_neither_records_nor_random_masks() -> None:
    """results.json's tables (results_page.page_tables): the per-row records stay in the seed files and MWOP's random
    plans keep their seeds and figures, not their masks; nothing else changes."""
    from lightprune.quality.results_page import page_tables

    taylor = {"method": "taylor", "plan": {"mask": [1, 0]}, "atr": 90.0}
    random_row = {"method": "random", "seeds": [0, 1], "per_seed": [{"seed": s, "atr": 80.0 + s, "plan": {"m": s}}
                                                                  for s in (0, 1)]}
    part = {"rows": [taylor, random_row], "records": {"metrics": {}}, "testbed": {"seed": 0}}
    kept = page_tables(part)
    assert "records" not in kept and kept["testbed"] == {"seed": 0}
    assert kept["rows"][0] == taylor  # a method's own plan stays: it is the result
    assert kept["rows"][1]["per_seed"] == [{"seed": 0, "atr": 80.0}, {"seed": 1, "atr": 81.0}]
    assert part["rows"][1]["per_seed"][0]["plan"] == {"m": 0} and "records" in part  # the input is not changed
    assert page_tables(None) is None

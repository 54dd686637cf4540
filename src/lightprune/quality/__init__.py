"""The results-page harness: every criterion side by side on the trained testbeds (docs/RESULTS.md).

`tables` measures the quality tables, `expert_quality` and `width_quality` the expert and
MWOP rows; `sweep_tables` and `mwop_section` render them, `bench_section` the benchmark figures
and `results_page` writes the page (``python scripts/quality_table.py``). It sits above everything it measures
and nothing imports it.

May import: anything (it measures the whole package).
"""

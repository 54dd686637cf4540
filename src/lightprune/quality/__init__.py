"""The results-page harness: every criterion side by side on the trained testbeds (docs/RESULTS.md).

:mod:`.tables` measures the quality tables, :mod:`.expert_quality` and :mod:`.width_quality` the expert and
MWOP rows; :mod:`.sweep_tables` and :mod:`.mwop_section` render them, :mod:`.bench_section` the benchmark figures
and :mod:`.results_page` writes the page (``python scripts/quality_table.py``). It sits above everything it measures
and nothing imports it.

May import: anything (it measures the whole package).
"""

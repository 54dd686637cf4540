"""What a run reports: ``report.json`` and its summary table and PNGs (`report`), and the run's
``report.md`` page written from the run's JSON files (`page`, also ``python -m lightprune.reporting.page``).

May import: experts, width and the shared leaves (it reads plans); never callbacks or the CLI.
"""

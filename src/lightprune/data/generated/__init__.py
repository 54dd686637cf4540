"""Data sets the project generates itself, cached as JSONL (+ PNG) with a manifest: Shapes QA (drawn
shapes), Testbed VQA (scikit-learn's digits, matplotlib bar charts, documentation text), seeded synthetic
tokens. :mod:`.qa` is the cache builder and datamodule base the QA sets share.

May import: the rest of :mod:`lightprune.data` and :mod:`lightprune.models`.
"""

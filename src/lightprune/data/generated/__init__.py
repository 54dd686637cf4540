"""Data sets the project generates itself, cached as JSONL (+ PNG) with a manifest: Shapes QA (drawn
shapes), Testbed VQA (scikit-learn's digits, matplotlib bar charts, documentation text), seeded synthetic
tokens. `qa` is the cache builder and datamodule base the QA sets share.

May import: the rest of `lightprune.data` and `lightprune.models`.
"""

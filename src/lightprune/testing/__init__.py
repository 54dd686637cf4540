"""Tiny random models of every supported family and their batches, built from configs (nothing downloaded).

- `tiny`: `tiny_config` / `tiny_model` by family name (``"tiny:<family>"`` model
  names resolve here), `TINY_FAMILIES` (MoE) and `TINY_DENSE_MLLMS` (dense MLLMs).
- `text` and `mllms`: the config builders of the text families and the multimodal ones.
- `batches`: random text and image+text batches shaped for a tiny model (its special tokens); `images`: each
  multimodal family's image placeholders and pixel inputs in those batches.

Used by the tests, the benchmarks, the testbeds and the README's default job. May import: models and the shared
leaves (core); nothing else of lightprune.
"""

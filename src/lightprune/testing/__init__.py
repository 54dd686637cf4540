"""Tiny random models of every supported family and their batches, built from configs (nothing downloaded).

- :mod:`.tiny`: :func:`~.tiny.tiny_config` / :func:`~.tiny.tiny_model` by family name (``"tiny:<family>"`` model
  names resolve here), :data:`~.tiny.TINY_FAMILIES` (MoE) and :data:`~.tiny.TINY_DENSE_MLLMS` (dense MLLMs).
- :mod:`.text` and :mod:`.mllms`: the config builders of the text families and the multimodal ones.
- :mod:`.batches`: random text and image+text batches shaped for a tiny model (its special tokens, image grids).

Used by the tests, the benchmarks, the testbeds and the README's default job. May import: models and the shared
leaves (core); nothing else of lightprune.
"""

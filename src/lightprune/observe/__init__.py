"""transformers-interface plumbing that observes a forward: the observing experts implementation
(`experts_impl`, ExpertsInterface), the attention probe (`attention_probe`) and the
AttentionInterface helpers (`attention_interface`) that width masking builds on.

May import: models and the shared leaves; it never changes what the forward computes.
"""

from __future__ import annotations

from lightprune.observe.attention_probe import PROBE_PREFIX, AttentionProbe, low_high_masks, modality_masks

__all__ = ["AttentionProbe", "low_high_masks", "modality_masks", "PROBE_PREFIX"]

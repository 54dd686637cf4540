"""Instrumentation of a model's forward: attention probes (and, from others, observing implementations)."""

from __future__ import annotations

from lightprune.observe.attention_probe import PROBE_PREFIX, AttentionProbe, low_high_masks, modality_masks

__all__ = ["AttentionProbe", "low_high_masks", "modality_masks", "PROBE_PREFIX"]

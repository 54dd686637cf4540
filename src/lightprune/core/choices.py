"""The values lightprune's options accept, in a leaf that imports nothing.

The modules that use a set of choices take it from here, and so does the command line, which checks a job's
options against them before it loads torch or Lightning (`lightprune.cli.command_line_checks`).
"""

from __future__ import annotations

__all__ = ["SUBSETS", "ATTENTION_SUBSETS", "VISION_SUBSETS", "ALLOCATIONS", "NORMALIZATIONS", "RETENTION_METRICS",
           "SENSITIVITY_SCORES", "QUANTIZE_FORMATS"]

#: token subsets a calibration statistic is taken over (the attention subsets: MAEP ("Modality-Aware Expert Pruning
#: for MoE-Based Multimodal Large Language Models", arXiv 2611.05927), sections 4.2 and 5.2)
SUBSETS = ("all", "text", "vision", "vision_low_attn", "vision_high_attn")
ATTENTION_SUBSETS = ("vision_low_attn", "vision_high_attn")
VISION_SUBSETS = ("vision",) + ATTENTION_SUBSETS
#: how a pruning ratio is spread over the layers, and how scores are made comparable across them
ALLOCATIONS = ("uniform", "global")
NORMALIZATIONS = (None, "log_zscore")
#: how a width-pruned model's answers are compared with the unpruned model's (lightprune.width.retention)
RETENTION_METRICS = ("token", "exact", "prob")
#: what router sensitivity ranks experts by (lightprune.experts.sensitivity)
SENSITIVITY_SCORES = ("weight", "signed_weight", "logit")
#: what an export may quantize its weights to once verified (lightprune.export.quantize): None keeps their dtype
QUANTIZE_FORMATS = (None, "fp8")

"""The values lightprune's options accept, in a leaf that imports nothing.

The modules that use a set of choices take it from here, and so does the command line, which checks a job's
options against them before it loads torch or Lightning (:mod:`lightprune.cli.options`).
"""

from __future__ import annotations

__all__ = ["SUBSETS", "ATTENTION_SUBSETS", "VISION_SUBSETS", "CALIBRATION_CRITERIA", "MERGE_STATISTICS",
           "ALLOCATIONS", "NORMALIZATIONS", "CRITERIA", "RETENTION_METRICS", "SENSITIVITY_SCORES"]

#: token subsets a calibration statistic is taken over (METHODS.md, "Token subsets")
SUBSETS = ("all", "text", "vision", "vision_low_attn", "vision_high_attn")
ATTENTION_SUBSETS = ("vision_low_attn", "vision_high_attn")
VISION_SUBSETS = ("vision",) + ATTENTION_SUBSETS
#: the statistics one calibration pass accumulates per expert (METHODS.md, "Calibration criteria")
CALIBRATION_CRITERIA = ("frequency", "seer", "ean", "reap", "routing_kl", "delta_h", "delta_h_promoted")
#: what the calibration pass also collects for the merging methods (HC-SMoE, M-SMoE)
MERGE_STATISTICS = ("expert_outputs", "router_logits")
#: how a pruning ratio is spread over the layers, and how scores are made comparable across them
ALLOCATIONS = ("uniform", "global")
NORMALIZATIONS = (None, "log_zscore")
#: the criteria lightprune registers (lightprune.experts.criteria; a test keeps the two equal)
CRITERIA = ("aimer", "delta_h", "delta_h_promoted", "ean", "frequency", "hc_smoe", "m_smoe", "maep", "magnitude",
            "random", "reap", "router_delta", "router_norm", "routing_kl", "seer")
#: how a width-pruned model's answers are compared with the unpruned model's (lightprune.width.retention)
RETENTION_METRICS = ("token", "exact", "prob")
#: what router sensitivity ranks experts by (lightprune.experts.sensitivity)
SENSITIVITY_SCORES = ("weight", "signed_weight", "logit")

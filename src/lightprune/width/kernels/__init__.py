"""Export-time kernels of MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs", appendix
D.5): path-sparse attention and the compact FFN.

``path_sparse_attention(query, key, value, modality, keep, backend=...)`` computes attention with the
pruned paths' keys removed before the softmax (`path_attention`); backends ``"triton"``
(`path_attention_triton`, imported only when used), ``"flex"``, ``"span"`` (`span_attention`: fused
SDPA calls on the kept key spans) and ``"sdpa"``. The retained key intervals the Triton kernel walks come from
`intervals.key_intervals`. `attention_cost` estimates each backend's time on a layer and prompt layout
and chooses one (the export records its choice per layer and device type).
`compact_ffn.CompactModalityFFN` runs a gated MLP with packed visual (and text) channels;
(`lightprune.width.swap.swap_compact_ffn` swaps it in for every FFN a WidthPlan prunes).

May import: torch, triton (lazily) and `lightprune.width.paths` only; the rest of ``width`` builds on it.
"""

from __future__ import annotations

from lightprune.width.kernels.attention_cost import (
                                                     CANDIDATES,
                                                     PROFILES,
                                                     KernelProfile,
                                                     attention_costs,
                                                     choose_attention,
    measure_profile,
)
from lightprune.width.kernels.compact_ffn import CompactModalityFFN, split_tokens
from lightprune.width.kernels.intervals import class_bits, class_table, key_intervals
from lightprune.width.kernels.path_attention import (
                                                     BACKENDS,
                                                     check_backend,
                                                     flex_path_attention,
                                                     path_block_mask,
                                                     path_keep_mask,
                                                     path_sparse_attention,
                                                     sdpa_path_attention,
)

__all__ = ["BACKENDS", "path_sparse_attention", "check_backend", "path_keep_mask", "path_block_mask",
           "sdpa_path_attention", "flex_path_attention", "key_intervals", "class_table", "class_bits",
           "CompactModalityFFN", "split_tokens", "CANDIDATES", "PROFILES", "KernelProfile", "attention_costs",
           "choose_attention", "measure_profile"]

"""Which of transformers' weight conversions (``conversion_mapping``: what ``from_pretrained`` runs on the
checkpoint's tensors) the streamed paths read through piece by piece: the standard per-expert merge
(`standard_merge`), a concatenation of whole fused tensors (`concatenates_fused`) and a transposition
(`transposed_dim`). [`Skeleton`][..skeleton.Skeleton] asks them of each checkpoint key's
converter.
"""

from __future__ import annotations

from typing import Any

__all__ = ["concatenates_fused", "standard_merge", "transposed_dim"]


def standard_merge(converter: Any) -> bool:
    """True for transformers' per-expert merge: ``MergeModulelist(dim=0)`` alone, or followed by
    ``Concatenate(dim=1)`` over several source patterns (gate then up)."""
    from transformers.core_model_loading import Concatenate, MergeModulelist

    ops = list(converter.operations)
    if not ops or type(ops[0]) is not MergeModulelist or ops[0].dim != 0:
        return False
    if len(ops) == 1:
        return len(converter.source_patterns) == 1
    return len(ops) == 2 and type(ops[1]) is Concatenate and ops[1].dim == 1 and \
        getattr(converter, "quantization_operation", None) is None


def concatenates_fused(converter: Any) -> bool:
    """True for a conversion that only concatenates whole fused tensors along a dimension after the first
    (``Concatenate(dim >= 1)`` over several source patterns: Step 3.7's ``gate_proj [E, I, H]`` and ``up_proj`` into
    ``gate_up_proj [E, 2I, H]``): each source then holds the experts on its dimension 0, as the target does."""
    from transformers.core_model_loading import Concatenate

    ops = list(getattr(converter, "operations", ()))
    return len(ops) == 1 and type(ops[0]) is Concatenate and ops[0].dim >= 1 and \
        len(converter.source_patterns) > 1 and getattr(converter, "quantization_operation", None) is None


def transposed_dim(converter: Any, dim: int) -> int | None:
    """The dimension of the stored tensor that becomes the model tensor's ``dim`` under a conversion that only swaps
    two dimensions (``Transpose(dim0, dim1)`` of one source: Ergo's router weight, stored [H, E]); None for any other
    conversion."""
    from transformers.core_model_loading import Transpose

    ops = list(getattr(converter, "operations", ()))
    if len(ops) != 1 or type(ops[0]) is not Transpose or len(converter.source_patterns) != 1 or \
            getattr(converter, "quantization_operation", None) is not None:
        return None
    swap = {ops[0].dim0: ops[0].dim1, ops[0].dim1: ops[0].dim0}
    return swap.get(dim, dim)

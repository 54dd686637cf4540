"""Masking (reversible) and structural removal of experts; reversible MWOP width masks."""

from .mask import is_masked, mask_experts
from .prune import prune_experts, resize_experts
from .width_mask import mask_width

__all__ = ["mask_experts", "is_masked", "prune_experts", "resize_experts", "mask_width"]

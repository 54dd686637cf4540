"""Masking (reversible) and structural removal of experts."""

from .mask import is_masked, mask_experts
from .prune import prune_experts, resize_experts

__all__ = ["mask_experts", "is_masked", "prune_experts", "resize_experts"]

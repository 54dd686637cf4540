"""Lightning callbacks: thin orchestration over lightprune's functional core."""

from .expert_pruning import ExpertPruning
from .export import Export

__all__ = ["ExpertPruning", "Export"]

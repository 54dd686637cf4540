"""Lightning callbacks: thin orchestration over lightprune's functional core."""

from .expert_pruning import ExpertPruning
from .expert_stats import ExpertStats
from .export import Export

__all__ = ["ExpertPruning", "ExpertStats", "Export"]

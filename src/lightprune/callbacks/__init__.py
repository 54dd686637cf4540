"""Lightning callbacks: thin orchestration over lightprune's functional core."""

from .expert_pruning import ExpertPruning
from .evaluate import Evaluate
from .expert_stats import ExpertStats
from .export import Export
from .router_delta import RouterDelta
from .width_export import WidthExport
from .width_search import WidthSearch

__all__ = ["Evaluate", "ExpertPruning", "ExpertStats", "Export", "RouterDelta", "WidthExport", "WidthSearch"]

"""Lightning callbacks: thin orchestration over lightprune's functional core."""

from .expert_pruning import ExpertPruning
from .evaluate import Evaluate
from .expert_stats import ExpertStats
from .export import Export
from .router_delta import RouterDelta
from .width_export import WidthExport
from .width_search import WidthSearch

__all__ = ["Evaluate", "ExpertPruning", "ExpertStats", "Export", "ReportPage", "RouterDelta", "WidthExport",
           "WidthSearch"]


def __getattr__(name: str):
    # ReportPage lives in lightprune.report_page (beside write_report_page), which imports this package
    if name == "ReportPage":
        from ..report_page import ReportPage

        return ReportPage
    raise AttributeError(f"module 'lightprune.callbacks' has no attribute {name!r}")

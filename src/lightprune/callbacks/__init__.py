"""Lightning callbacks: thin orchestration over lightprune's functional core."""

from lightprune.callbacks.evaluate import Evaluate
from lightprune.callbacks.expert_pruning import ExpertPruning
from lightprune.callbacks.expert_stats import ExpertStats
from lightprune.callbacks.export import Export
from lightprune.callbacks.report_page import ReportPage
from lightprune.callbacks.router_delta import RouterDelta
from lightprune.callbacks.width_export import WidthExport
from lightprune.callbacks.width_search import WidthSearch

__all__ = ["Evaluate", "ExpertPruning", "ExpertStats", "Export", "ReportPage", "RouterDelta", "WidthExport",
           "WidthSearch"]

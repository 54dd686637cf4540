"""Lightning callbacks: thin orchestration over lightprune's functional core, one callback per file.

They share one :class:`~lightprune.callbacks.state.RunState` (calibration statistics, expert scores, the expert
and width plans, the active width masks) and never look each other up; end-of-job steps run in phase order,
wherever they are listed (:mod:`.job_end`).

May import: everything below it (experts, width, export, finetune, reporting, models, observe, data and the
shared leaves); never the trainer, the CLI or quality.
"""

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

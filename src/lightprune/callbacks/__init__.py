"""Lightning callbacks: thin orchestration over lightprune's functional core, one callback per file.

Each callback's options are stated once, torch-free, in `options` (the constructor checks its values
through them, and the command line runs the same checks before Lightning loads). They share one
`RunState` (calibration statistics, expert scores, the expert
and width plans, the active width masks) and never look each other up; end-of-job steps run in phase order,
wherever they are listed ([`job_end`][.job_end]).

May import: everything below it (experts, width, export, finetune, reporting, models, observe, data and the
core); never the CLI or quality. Its names are imported on first use.
"""

from __future__ import annotations

from lightprune.core.lazy import lazy_attributes

_NAMES = {"Evaluate": "lightprune.callbacks.evaluate", "ExpertPruning": "lightprune.callbacks.expert_pruning",
          "ExpertStats": "lightprune.callbacks.expert_stats", "Export": "lightprune.callbacks.export",
          "ReportPage": "lightprune.callbacks.report_page", "RouterDelta": "lightprune.callbacks.router_delta",
          "WidthExport": "lightprune.callbacks.width_export", "WidthSearch": "lightprune.callbacks.width_search"}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_attributes(__name__, _NAMES)

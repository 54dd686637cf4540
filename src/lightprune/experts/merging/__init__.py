"""Expert merging (MAEP's HC-SMoE baseline; M-SMoE): clusters of a layer's experts folded into one expert each.

- [`plan`][.plan] ([`MergePlan`][.plan.MergePlan]: clusters, dominants, coefficients; the only thing passed from
  clustering to surgery), [`merge`][.merge] (the merged tensors, reversible and structural), `cluster` (HC-SMoE's
  average-linkage clustering), `align` (M-SMoE's neuron alignment), [`methods`][.methods] (HC-SMoE and
  M-SMoE: calibration statistics -> MergePlan).

May import: models, observe, experts.plan / experts.prune / experts.mask / experts.calibration and the shared
leaves; never width, finetune, export, callbacks or anything above.
"""

from __future__ import annotations

from lightprune.core.lazy import lazy_package

_NAMES = {
    "merge_experts": "lightprune.experts.merging.merge",
    "merged_experts": "lightprune.experts.merging.merge",
    "write_merged": "lightprune.experts.merging.merge",
    "hc_smoe_plan": "lightprune.experts.merging.methods",
    "m_smoe_plan": "lightprune.experts.merging.methods",
    "MergePlan": "lightprune.experts.merging.plan",
    "ROUTER_RULES": "lightprune.experts.merging.plan",
}
__all__ = lazy_package(__name__, _NAMES)

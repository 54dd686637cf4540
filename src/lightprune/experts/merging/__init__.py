"""Expert merging (MAEP's HC-SMoE baseline; M-SMoE): clusters of a layer's experts folded into one expert each.

- :mod:`.plan` (:class:`MergePlan`: clusters, dominants, coefficients; the only thing passed from clustering
  to surgery), :mod:`.merge` (the merged tensors, reversible and structural), :mod:`.cluster` (HC-SMoE's
  average-linkage clustering), :mod:`.align` (M-SMoE's neuron alignment), :mod:`.methods` (HC-SMoE and
  M-SMoE: calibration statistics -> MergePlan).

May import: models, observe, experts.plan / experts.prune / experts.mask / experts.calibration and the shared
leaves; never width, finetune, export, callbacks or anything above.
"""

from lightprune.experts.merging.merge import merge_experts, merged_experts, write_merged
from lightprune.experts.merging.methods import hc_smoe_plan, m_smoe_plan
from lightprune.experts.merging.plan import ROUTER_RULES, MergePlan

__all__ = ["MergePlan", "ROUTER_RULES", "hc_smoe_plan", "m_smoe_plan", "merge_experts", "merged_experts",
           "write_merged"]

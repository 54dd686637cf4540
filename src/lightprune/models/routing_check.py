"""The refusal of a NaN or inf in a tensor a MoE layer's routing reads: :func:`check_routing_tensors`.

A non-finite routing tensor is accepted by every computation downstream of it: a NaN correction bias (DeepSeek-V3's
``e_score_correction_bias``) makes its expert's group score NaN, so the whole group gets no tokens while the router's
logits stay finite; a NaN router row or per-expert scale reaches the weights of every token. Calibration would sum
the skewed routing into every statistic and a prune would carry the tensor into its export. Every entry point that
observes or slices the routing checks the tensors its family lists (:meth:`MoEFamily.routing_tensors
<lightprune.models.base.MoEFamily.routing_tensors>`) with this one function, so that the refusal is the same wherever
it is found. Parameters cannot change within a pass: the check runs once per layer and pass, one host sync per layer.
"""

from __future__ import annotations

import torch

from lightprune.models.layer import MoELayer, RoutingTensor

__all__ = ["check_routing_tensors", "non_finite_routing_tensor"]


def _readable(tensor: torch.Tensor) -> torch.Tensor | None:
    """The tensor as ``torch.isfinite`` reads it (float8 widened), None for one without values here (the meta device,
    a ZeRO-3 partition outside a gather) or without a NaN to hold (integers, booleans)."""
    if tensor.device.type == "meta" or tensor.numel() == 0 or not tensor.is_floating_point():
        return None
    tensor = tensor.detach()
    return tensor.float() if tensor.element_size() == 1 else tensor


def non_finite_routing_tensor(layer: MoELayer) -> RoutingTensor | None:
    """The first tensor of :meth:`~lightprune.models.base.MoEFamily.routing_tensors` that holds a NaN or inf (None:
    none), tensors not in memory skipped. One reduction per tensor and one host sync per device the layer is on."""
    by_device: dict[torch.device, list[tuple[RoutingTensor, torch.Tensor]]] = {}
    for found in layer.family.routing_tensors(layer):
        values = _readable(found.tensor)
        if values is not None:
            by_device.setdefault(values.device, []).append((found, values))
    for group in by_device.values():
        finite = torch.stack([torch.isfinite(values).all() for _, values in group]).tolist()  # the host sync
        for (found, _), ok in zip(group, finite, strict=True):
            if not ok:
                return found
    return None


def check_routing_tensors(layer: MoELayer, where: str, outcome: str) -> None:
    """Raise ``ValueError`` when a tensor ``layer``'s routing reads holds a NaN or inf, naming ``where`` it was found
    (the entry point; calibration adds the batch it was about to observe), the layer (index, module name), the
    tensor (its name in the model, its shape), how many values are not finite and the first one's index, then
    ``outcome`` (what was not done)."""
    found = non_finite_routing_tensor(layer)
    if found is None:
        return
    values = _readable(found.tensor)
    nan, inf = torch.isnan(values), torch.isinf(values)
    bad = nan | inf
    count, first = int(bad.sum()), bad.nonzero()[0].tolist()
    raise ValueError(
        f"{where}, MoE layer {layer.index} ({layer.name}): routing tensor {found.name} {list(values.shape)} holds "
        f"{count} NaN or inf value{'s' if count != 1 else ''} ({int(nan.sum())} NaN, {int(inf.sum())} inf), the first "
        f"at index {first}; {outcome}. The layer routes every token with it: restore the tensor from an intact copy of "
        "the checkpoint (download or convert it again)")

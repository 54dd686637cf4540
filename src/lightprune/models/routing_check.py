"""The refusal of a NaN or inf in a tensor a MoE layer's routing reads: `check_routing_tensors`.

A non-finite routing tensor is accepted by every computation downstream of it: a NaN correction bias (DeepSeek-V3's
``e_score_correction_bias``) makes its expert's group score NaN, so the whole group gets no tokens while the router's
logits stay finite; a NaN router row or per-expert scale reaches the weights of every token. Calibration would sum the
skewed routing into every statistic and a prune would carry the tensor into its export. Every entry point that observes
or slices the routing checks the tensors its family lists (`MoEFamily.routing_tensors`) with this one function, so that
the refusal is the same wherever it is found. Parameters cannot change within a pass: the check runs once per layer and
pass, one host sync per layer.
"""

from __future__ import annotations

import torch

from lightprune.models.layer import MoELayer, RoutingTensor

__all__ = ["check_routing_tensors", "names_and_shapes", "non_finite_routing_tensor", "routing_tensors_message",
           "routing_tensors_record"]


def _readable(tensor: torch.Tensor) -> torch.Tensor | None:
    """The tensor as ``torch.isfinite`` reads it (float8 widened), None for one without values here (the meta device,
    a ZeRO-3 partition outside a gather) or without a NaN to hold (integers, booleans)."""
    if tensor.device.type == "meta" or tensor.numel() == 0 or not tensor.is_floating_point():
        return None
    tensor = tensor.detach()
    return tensor.float() if tensor.element_size() == 1 else tensor


def routing_tensors_record(layer: MoELayer) -> tuple[torch.Tensor, list[RoutingTensor]] | None:
    """What `check_routing_tensors` reads, computed on the layer's device without a host sync: (``record`` [6] int64:
    non-finite tensors, the first one's position, its non-finite values, NaN, inf, the first value's flat index; the
    tensors of `routing_tensors` in memory, in order), or None when none is. Tensors on several devices: their counts
    meet on the first one's."""
    found = [(entry, values) for entry in layer.family.routing_tensors(layer)
             if (values := _readable(entry.tensor)) is not None]
    if not found:
        return None
    device = found[0][1].device
    rows = []
    for _, values in found:
        nan, inf = torch.isnan(values), torch.isinf(values)
        bad = (nan | inf).flatten()
        first = torch.argmax(bad.to(torch.uint8)) if bad.numel() else torch.zeros((), dtype=torch.long,
                                                                                    device=bad.device)
        rows.append(torch.stack([bad.sum(), nan.sum(), inf.sum(), first]).to(device))
    stats = torch.stack(rows)  # [n, 4]
    failed = stats[:, 0] > 0
    which = torch.argmax(failed.to(torch.uint8))
    record = torch.cat([torch.stack([failed.sum(), which]), stats[which]])
    return record, [entry for entry, _ in found]


def non_finite_routing_tensor(layer: MoELayer) -> RoutingTensor | None:
    """The first tensor of `routing_tensors` that holds a NaN or inf (None:
    none), tensors not in memory skipped (`routing_tensors_record`, read once)."""
    found = routing_tensors_record(layer)
    if found is None:
        return None
    record, tensors = found
    failed, which = record[:2].tolist()
    return tensors[which] if failed else None


def routing_tensors_message(layer: MoELayer, record: list[int], tensors: list[tuple[str, tuple[int, ...]]],
                            where: str, outcome: str) -> str:
    """The refusal of `check_routing_tensors` from a read `routing_tensors_record` (``tensors``: the
    names and shapes of its tensors, which a caller keeps instead of the tensors)."""
    _, which, count, nan, inf, flat = record
    name, shape = tensors[which]
    first = [int(i) for i in torch.unravel_index(torch.tensor(flat), shape)] if shape else []
    return (f"{where}, MoE layer {layer.index} ({layer.name}): routing tensor {name} {list(shape)} holds "
            f"{count} NaN or inf value{'s' if count != 1 else ''} ({nan} NaN, {inf} inf), the first at index {first}; "
            f"{outcome}. The layer routes every token with it: restore the tensor from an intact copy of the "
            "checkpoint (download or convert it again)")


def check_routing_tensors(layer: MoELayer, where: str, outcome: str) -> None:
    """Raise ``ValueError`` when a tensor ``layer``'s routing reads holds a NaN or inf, naming ``where`` it was found
    (the entry point; calibration adds the batch it was about to observe), the layer (index, module name), the
    tensor (its name in the model, its shape), how many values are not finite and the first one's index, then
    ``outcome`` (what was not done). One host read."""
    found = routing_tensors_record(layer)
    if found is None:
        return
    record, tensors = found
    values = record.tolist()
    if values[0]:
        raise ValueError(routing_tensors_message(layer, values, names_and_shapes(tensors), where, outcome))


def names_and_shapes(tensors: list[RoutingTensor]) -> list[tuple[str, tuple[int, ...]]]:
    """What a refusal names of the tensors of `routing_tensors_record`."""
    return [(entry.name, tuple(entry.tensor.shape)) for entry in tensors]

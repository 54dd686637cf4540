"""Per-expert reductions over fused 3D expert tensors, read in place.

transformers 5 keeps a layer's routed experts as fused parameters whose first dimension is the
expert: ``gate_up_proj [E, 2I, H]`` (or ``gate_proj``/``up_proj``) and ``down_proj [E, H, I]``.
:func:`expert_weight_norms` returns, per expert, the l1 norm and the squared l2 norm of the
concatenation of the expert's slices of those tensors (biases excluded), which is all the
weight criteria need.

Speed and accuracy: a tensor is viewed as rows ``[E * R, C]`` (C its last dimension; no copy)
and streamed in blocks of about ``block_elements`` values that stay in cache: ``abs`` and the
square go into one reused fp32 buffer, each followed by a row sum, so memory is read once per
block and the rest is cache traffic. Row sums (fp32, C terms each) are added per expert in
float64. On CPU this is ~1.5-2x faster than two ``torch.linalg.vector_norm`` passes over whole
experts, ~4x faster than ``t.abs().sum()`` (which materialises ``|t|``) and ~1e5x more accurate
than one fp32 reduction per expert (that loses ~1e-4 relative accuracy on large experts, enough
to reorder experts whose AIMER differ in the fourth digit). Half-precision weights are
converted into an fp32 buffer block by block, so extra memory is a few blocks.
"""

from __future__ import annotations

import torch

from ..models import MoELayer

__all__ = ["EXPERT_WEIGHT_NAMES", "expert_weight_tensors", "expert_weight_norms", "default_block_elements"]

#: fused expert weight parameters, in the order gate, up, down (biases are not weights)
EXPERT_WEIGHT_NAMES: tuple[str, ...] = ("gate_up_proj", "gate_proj", "up_proj", "down_proj")


def expert_weight_tensors(layer: MoELayer) -> list[tuple[str, torch.Tensor]]:
    """``[(name, tensor [E, ...])]``: the layer's fused expert weight tensors (no copies, no biases)."""
    experts = layer.experts
    found = []
    for name in EXPERT_WEIGHT_NAMES:
        tensor = getattr(experts, name, None)
        if not isinstance(tensor, torch.Tensor):
            continue
        if tensor.dim() < 2 or tensor.shape[0] != layer.num_experts:
            raise ValueError(f"layer {layer.index} ({layer.name}): experts.{name} has shape {tuple(tensor.shape)}; "
                             f"expected [{layer.num_experts}, ...] with one slice per routed expert")
        if not tensor.is_floating_point():
            raise TypeError(f"layer {layer.index} ({layer.name}): experts.{name} is {tensor.dtype}; weight "
                            "criteria read floating-point weights (dequantise quantised experts first)")
        if tensor.device.type == "meta" or tensor.numel() == 0:
            raise ValueError(f"layer {layer.index} ({layer.name}): experts.{name} holds no data "
                             f"(device {tensor.device}, shape {tuple(tensor.shape)}); materialise or gather "
                             "the weights (DeepSpeed ZeRO-3: GatheredParameters) before scoring")
        found.append((name, tensor))
    if not found:
        params = [n for n, _ in experts.named_parameters(recurse=False)]
        raise ValueError(f"layer {layer.index} ({layer.name}): no fused expert weights among "
                         f"{EXPERT_WEIGHT_NAMES} on {type(experts).__name__} (has {params})")
    return found


def default_block_elements(device: torch.device) -> int:
    """Elements per block: on CPU 2^18 (1 MiB fp32, an L2 cache) per intra-op thread, at most 2^22;
    on accelerators 2^24, to amortise kernel launches."""
    if device.type == "cpu":
        return min(1 << 22, (1 << 18) * max(1, torch.get_num_threads()))
    return 1 << 24


def _rows(tensor: torch.Tensor) -> tuple[list[tuple[int, torch.Tensor]], int]:
    """``([(first expert, rows [M, C])], R)``: the tensor as 2D row views, R rows per expert.

    Contiguous tensors give one view of all experts; others one (strided) view per expert.
    """
    num = tensor.shape[0]
    cols = tensor.shape[-1] if tensor.dim() > 2 else tensor[0].numel()
    per_expert = tensor[0].numel() // cols
    if tensor.is_contiguous():
        return [(0, tensor.view(num * per_expert, cols))], per_expert
    return [(e, tensor[e].reshape(per_expert, cols)) for e in range(num)], per_expert


@torch.no_grad()
def expert_weight_norms(layer: MoELayer, *, l1: bool = True, sq: bool = True,
                        block_elements: int | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None, int]:
    """Per-expert ``(||w_e||_1, ||w_e||_2^2, N)`` over the expert's flattened gate, up and down weights.

    ``w_e`` concatenates expert ``e``'s slices of every tensor of :func:`expert_weight_tensors`;
    ``N`` is its length. Norms are float64 tensors ``[E]`` on the weights' device (None when
    not asked for). ``block_elements`` defaults to :func:`default_block_elements`. Runs under
    ``torch.no_grad()``.
    """
    if not (l1 or sq):
        raise ValueError("ask for at least one of l1, sq")
    tensors = expert_weight_tensors(layer)
    device = tensors[0][1].device
    block = default_block_elements(device) if block_elements is None else int(block_elements)
    if block < 1:
        raise ValueError(f"block_elements must be >= 1, got {block_elements}")
    num = layer.num_experts
    l1_out = torch.zeros(num, dtype=torch.float64, device=device) if l1 else None
    sq_out = torch.zeros(num, dtype=torch.float64, device=device) if sq else None
    numel = 0
    # block-sized work buffers (abs / square output, dtype conversion) shared by the layer's tensors
    rows_of = [_rows(tensor) for _, tensor in tensors]
    size = max([block] + [views[0][1].shape[1] for views, _ in rows_of])
    buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def buffer(key: str, dtype: torch.dtype, n: int, cols: int) -> torch.Tensor:
        if (key, dtype) not in buffers:
            buffers[(key, dtype)] = torch.empty(size, dtype=dtype, device=device)
        return buffers[(key, dtype)][:n * cols].view(n, cols)

    for (_, tensor), (views, per_expert) in zip(tensors, rows_of):
        numel += tensor[0].numel()
        cols = views[0][1].shape[1]
        step = max(1, block // cols)
        work = torch.float64 if tensor.dtype == torch.float64 else torch.float32
        l1_rows = torch.empty(num * per_expert, dtype=work, device=device) if l1 else None
        sq_rows = torch.empty(num * per_expert, dtype=work, device=device) if sq else None
        for first, rows in views:
            offset = first * per_expert
            for start in range(0, rows.shape[0], step):
                src = rows[start:start + step]
                n = src.shape[0]
                out = buffer("out", work, n, cols)
                if tensor.dtype != work:
                    src = buffer("convert", work, n, cols).copy_(src)
                at = slice(offset + start, offset + start + n)
                if l1_rows is not None:
                    torch.sum(torch.abs(src, out=out), dim=-1, out=l1_rows[at])
                if sq_rows is not None:
                    torch.sum(torch.mul(src, src, out=out), dim=-1, out=sq_rows[at])
        if l1_out is not None:
            l1_out += l1_rows.view(num, per_expert).sum(dim=1, dtype=torch.float64)
        if sq_out is not None:
            sq_out += sq_rows.view(num, per_expert).sum(dim=1, dtype=torch.float64)
    return l1_out, sq_out, numel

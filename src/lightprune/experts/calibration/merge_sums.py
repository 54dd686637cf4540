"""The statistics expert merging clusters by, summed over calibration tokens in the observed pass.

- ``expert_outputs`` (HC-SMoE, Chen et al. 2025, section 3.1): every routed expert's unweighted output on every
  calibration token, whether the router picked it or not, summed per expert: ``[E, H]``; divided by the token
  count it is the expert's mean output, the vector HC-SMoE clusters experts by;
- ``router_logits`` (M-SMoE, Li et al. 2024, section 3.1): the Gram matrix of the router logits over tokens,
  sum_t l_t l_t^T ``[E, E]``; the cosine of experts i and j over the calibration tokens is
  G_ij / sqrt(G_ii G_jj).

Tokens are those of the collected subsets (padding excluded). Nothing per token is kept across batches: each
layer-batch adds its sums, computed in float32 on the model's device (all experts on a chunk of tokens at a
time, in one grouped matmul per projection), to float64 sums held on the CPU.
"""

from __future__ import annotations

import torch

from lightprune.core.choices import MERGE_STATISTICS
from lightprune.models import MoELayer
from lightprune.observe.experts_impl import expert_rows

__all__ = ["MERGE_STATISTICS", "MergeSums"]

#: elements of the dense outputs computed at once (tokens x experts x width)
_CHUNK_ELEMENTS = 1 << 22


def _output_width(layer: MoELayer) -> int:
    """The experts' output width: ``down_proj`` is [E, H, I], or [E, I, H] when the module is transposed."""
    down = layer.experts.down_proj
    return int(down.shape[2] if getattr(layer.experts, "is_transposed", False) else down.shape[1])


class MergeSums:
    """Sums of :data:`MERGE_STATISTICS` (those named in ``statistics``) for one MoE layer."""

    def __init__(self, layer: MoELayer, statistics: tuple[str, ...]):
        unknown = [s for s in statistics if s not in MERGE_STATISTICS]
        if unknown:
            raise ValueError(f"unknown merging statistics {unknown}; choose from {list(MERGE_STATISTICS)}")
        self.index, self.num_experts = layer.index, layer.num_experts
        self.sums: dict[str, torch.Tensor] = {"tokens": torch.zeros((), dtype=torch.float64)}
        if "expert_outputs" in statistics:
            self.sums["expert_outputs"] = torch.zeros(layer.num_experts, _output_width(layer), dtype=torch.float64)
        if "router_logits" in statistics:
            self.sums["router_logits"] = torch.zeros(layer.num_experts, layer.num_experts, dtype=torch.float64)

    @torch.no_grad()
    def update(self, layer: MoELayer, hidden: torch.Tensor, router_input: torch.Tensor, keep: torch.Tensor) -> None:
        """Add one batch: ``hidden`` [T, H] the experts' input, ``router_input`` [T, H'] the router's, ``keep`` [T]
        the tokens counted (in a collected subset)."""
        rows = keep.nonzero().flatten()
        if not rows.numel():
            return
        self.sums["tokens"] += float(rows.numel())
        if "expert_outputs" in self.sums:
            self.sums["expert_outputs"] += dense_output_sum(layer, hidden[rows]).double().cpu()
        if "router_logits" in self.sums:
            logits = layer.family.router_logits(layer, router_input[rows]).float()
            self.sums["router_logits"] += (logits.T @ logits).double().cpu()

    def means(self) -> dict[str, torch.Tensor]:
        """Each statistic divided by the token count (float64, CPU)."""
        count = max(float(self.sums["tokens"]), 1.0)
        return {name: t / count for name, t in self.sums.items() if name != "tokens"}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: t.clone() for name, t in self.sums.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name, t in self.sums.items():
            if name not in state or state[name].shape != t.shape:
                raise ValueError(f"layer {self.index}: calibration state has no merging statistic {name!r} of "
                                 f"shape {tuple(t.shape)}")
            t.copy_(state[name])


def dense_output_sum(layer: MoELayer, x: torch.Tensor) -> torch.Tensor:
    """sum_t f_e(x_t) for every routed expert e: ``[E, H]`` in float32 (or wider), ``x`` [n, H_in]."""
    experts, num = layer.experts, layer.num_experts
    width = max(x.shape[-1], _output_width(layer))
    step = max(1, _CHUNK_ELEMENTS // (num * width))
    dtype = torch.promote_types(x.dtype, torch.float32)
    total = torch.zeros(num, _output_width(layer), dtype=dtype, device=x.device)
    ids = torch.arange(num, device=x.device)
    for start in range(0, x.shape[0], step):
        chunk = x[start:start + step]
        n = chunk.shape[0]
        tokens = torch.arange(n, device=x.device).repeat(num)
        out = expert_rows(experts, chunk, tokens, ids.repeat_interleave(n))      # expert-major: [E * n, H]
        total += out.view(num, n, -1).to(dtype).sum(dim=1)
    return total

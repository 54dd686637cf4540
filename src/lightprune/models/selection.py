"""A selection's expert outputs, as calibration reads them and the MoE block sums them.

`selection_outputs` runs the ids each token selected ([T, k]) and any further (token, id) rows in one call, so
that the selected experts and the rows a criterion asks for share the same grouped matmuls; `weighted_sum` is
the block's output from them, summed in float32 (float64 for a float64 model) as transformers' experts sum it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["selection_outputs", "weighted_sum"]


def selection_outputs(index: torch.Tensor, extra: tuple[torch.Tensor, torch.Tensor] | None,
                      rows: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(unweighted outputs [T, k, H] of the ids ``index`` [T, k], those of the ``extra`` (tokens, ids) rows [n, H]
    or None), from one call ``rows(tokens [m], ids [m]) -> [m, H]``."""
    num_tokens, k = index.shape
    tokens = torch.arange(num_tokens, device=index.device).repeat_interleave(k)
    ids = index.reshape(-1)
    if extra is not None:
        tokens = torch.cat([tokens, extra[0].to(tokens.device)])
        ids = torch.cat([ids, extra[1].to(ids.device)])
    every = rows(tokens, ids)
    return every[:num_tokens * k].view(num_tokens, k, -1), (every[num_tokens * k:] if extra is not None else None)


def weighted_sum(outputs: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """sum_s w[t, s] f[t, s] [T, H] of outputs [T, k, H] and weights [T, k], in float32 (float64 for a float64
    model), returned in ``dtype``."""
    wide = torch.promote_types(outputs.dtype, torch.float32)
    return (outputs.to(wide) * weights.to(wide).unsqueeze(-1)).sum(dim=1).to(dtype)

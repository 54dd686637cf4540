"""How removing one expert changes each token's routing: [`RemovalEffect`][], what a family's
``removal_effect`` returns and Delta-H reads (MAEP eq. 2)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["RemovalEffect"]


@dataclass(eq=False)
class RemovalEffect:
    """How removing one expert j changes each token's routing, for Delta-H (MAEP eq. 2) without re-running the
    selection E times per token ([`MoEFamily.removal_effect`][]). For token t, in order of precedence:

    - ``rerun`` [T, m] (-1 = no expert, ids may repeat): the removals whose effect has no closed form here;
      calibration re-runs the family's selection with j masked;
    - ``swap_*`` (None: no closed form, the selected experts must then be in ``rerun``): removing
      ``selected[t, r]`` multiplies every other selected weight by ``1 + swap_factor[t, r]`` ([T, k]) and routes
      expert ``swap_expert[t]`` ([T]: the same expert enters whichever selected one leaves) with weight
      ``swap_weight[t, r]`` ([T, k], before the family's ``output_scale``);
    - ``growth`` [T, E] (None: zero): any other removal keeps the selection and multiplies every selected weight by
      ``1 + growth[t, j]`` (the excess over 1, so that a small change keeps its digits in float32).

    A family that computes the re-run selections itself gives them as ``rerun_weights`` / ``rerun_selected``
    ([T, m, k], before ``output_scale``; any values at -1 slots), else calibration calls
    [`MoEFamily.select_without`][] for each pair. ``rerun_alias`` [T, m] (-1 = none) names a second expert whose
    removal gives exactly the selection of the slot's (DeepSeek-V3: both top-2 experts of a group that then drops out
    of the chosen groups), so that it is computed once.
    """

    rerun: torch.Tensor
    growth: torch.Tensor | None = None
    swap_factor: torch.Tensor | None = None
    swap_expert: torch.Tensor | None = None
    swap_weight: torch.Tensor | None = None
    rerun_weights: torch.Tensor | None = None
    rerun_selected: torch.Tensor | None = None
    rerun_alias: torch.Tensor | None = None

"""Run the FFNs a WidthPlan prunes as compact modality FFNs, in memory and reversibly (MWOP ("MWOP: Modality-aware
Width-wise Operation Pruning for Efficient MLLMs"), section 3).

`swap_compact_ffn` replaces the MLP forward of every layer the plan prunes by its `CompactModalityFFN` and records
the token modality through `WidthHooks` (which also masks the plan's attention paths, when asked): the exported
model's FFN runtime.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from lightprune.width.kernels.compact_ffn import CompactModalityFFN, split_tokens
from lightprune.width.layers import find_width_layers
from lightprune.width.mask import RemovableHandle, WidthHooks, recorded_modality
from lightprune.width.plan import WidthPlan

__all__ = ["CompactFFNSwap", "swap_compact_ffn"]


class CompactFFNSwap(RemovableHandle):
    """What `swap_compact_ffn` installed; ``remove()`` (or leaving a ``with`` block) restores the model.

    ``modules[l]`` is layer l's `CompactModalityFFN`; ``hooks`` the `WidthHooks` that record
    the token modality (``hooks.state.modality``) and, with ``mask_attention``, mask the plan's paths.
    """

    removed = "this compact FFN swap was removed"

    def __init__(self, model: nn.Module, plan: WidthPlan, align: int = 64, *, mask_attention: bool = True,
                 attention_backend: str | Mapping | None = None):
        if not isinstance(plan, WidthPlan):
            raise TypeError(f"swap_compact_ffn needs a WidthPlan, got {type(plan).__name__}")
        plan.validate(model)
        layers = {layer.index: layer for layer in find_width_layers(model)}
        for i in sorted(plan.ffn_keep):
            mlp = layers[i].mlp
            if "forward" in vars(mlp):
                raise RuntimeError(f"layer {i}: {type(mlp).__name__}.forward is already replaced on the instance "
                                   f"(an accelerate hook or another swap); swap_compact_ffn would bypass it")
        # the modality pre-hook (and the attention masks, when asked) without FFN masks
        rest = WidthPlan(attn_keep=dict(plan.attn_keep) if mask_attention else {}, ffn_keep={},
                         num_heads=dict(plan.num_heads), intermediate_size=dict(plan.intermediate_size))
        self.hooks = WidthHooks(model, rest, attention_backend=attention_backend)
        self.modules: dict[int, CompactModalityFFN] = {}
        try:  # the MLPs' channels are permuted in place (share_weights): all of them put back on a failure
            for i in sorted(plan.ffn_keep):
                self.modules[i] = CompactModalityFFN.from_mlp(layers[i].mlp, plan.ffn_keep[i], align,
                                                              share_weights=True)
        except BaseException:
            for module in self.modules.values():
                module.restore()
            self.hooks.remove()
            raise
        self._mlps = {i: layers[i].mlp for i in self.modules}
        self._split: dict = {}
        for i, mlp in self._mlps.items():
            mlp.forward = self._forward(i)

    def _forward(self, index: int):
        compact, state, cache = self.modules[index], self.hooks.state, self._split

        def forward(x: torch.Tensor) -> torch.Tensor:
            tokens = recorded_modality(state, x, f"compact FFN, layer {index}", "input")
            mod = state.modality
            # every layer of one forward sees the same recorded tensor: split its tokens once
            if cache.get("of") is not mod or cache.get("length") != x.shape[1] or cache["device"] != x.device:
                cache.update(of=mod, length=x.shape[1], device=x.device, split=split_tokens(tokens.to(x.device)))
            return compact(x, tokens, cache["split"])

        return forward

    @property
    def active(self) -> bool:
        return self.hooks.active

    def remove(self) -> None:
        """Restore every MLP forward and its channel order, and remove the hooks (idempotent)."""
        for mlp in self._mlps.values():
            vars(mlp).pop("forward", None)
        for module in self.modules.values():
            module.restore()
        self._mlps = {}
        self._split.clear()
        self.hooks.remove()


def swap_compact_ffn(model: nn.Module, plan: WidthPlan, align: int = 64, *, mask_attention: bool = True,
                     attention_backend: str | Mapping | None = None) -> CompactFFNSwap:
    """Run every FFN that ``plan`` prunes as a `CompactModalityFFN` (in memory, reversible). An FFN that prunes
    one modality runs slices of its own weights, its channels permuted in place (``share_weights``: no packed copy;
    ``state_dict`` refused until `remove` puts them back, bitwise).

    With ``mask_attention`` (default) the plan's attention paths are masked as [`mask_width`][] does, so
    the model computes what ``mask_width(model, plan)`` computes; ``mask_attention=False`` leaves attention
    dense (for a path-sparse attention installed separately, which can read ``handle.hooks.state``).
    ``attention_backend`` (``"sdpa"``, ``"span"``, ``"flex"``, ``"triton"``, or per layer ``{layer: name}`` /
    ``{layer: {device type: name}}``, as an export chose them: `lightprune.width.attention_choice`) runs the
    masked paths through [`lightprune.width.kernels.path_sparse_attention`][...kernels.path_sparse_attention] instead of
    a dense per-head mask:
    the exported model's runtime ([`lightprune.export.load_pruned`][lightprune.export.load.load_pruned] of a width
    checkpoint). Nesting with ``mask_width`` / another swap is refused (one `WidthHooks` per model).
    """
    return CompactFFNSwap(model, plan, align, mask_attention=mask_attention, attention_backend=attention_backend)

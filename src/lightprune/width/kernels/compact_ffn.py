"""Compact modality-conditioned FFN: packed visual weights for MWOP's pruned visual channels.

MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), appendix D.5 ("Modality-Conditioned
FFNs"): the retained rows of the gate and up projections, with the matching columns of the down projection, are
packed into compact visual weights; visual tokens use them, text tokens the full FFN, and an empty visual channel set
gives a zero FFN update. For a gated MLP ``y = W_down (act(W_gate x) * (W_up x))`` with m channels and a keep mask
``keep_mu`` of k_mu channels for modality mu, a token of modality mu computes

    y = W_down[:, P] (act(W_gate[P] x) * (W_up[P] x)),   P = the kept channels, zero-padded to
    m~_mu = min(m, b * ceil(k_mu / b))   (appendix D.4, alignment b = ``align``, default 64),

which equals the mask-mode MLP of `lightprune.width.mask` (``h * keep_mu`` before
``down_proj``). SYSTEM and PAD tokens, and a modality whose mask keeps every channel, run the full FFN;
a plan that prunes text channels gets text weights packed the same way.

When only the visual channels are pruned (the paper's configurations), every token runs the packed
kept channels in one matmul chain and the tokens on the full FFN (text, SYSTEM, PAD) add the remaining
channels, gathered and scatter-added, so every weight is read once per call as in the dense FFN. With
``share_weights`` (what `swap_compact_ffn` and so an exported model run) the kept
channels are a slice of the MLP's own weights, its channels permuted in place (kept first; the output of a gated MLP
does not depend on the order), so no packed copy is held; a call without a token of the pruned modality (text-only
decoding) runs the dense MLP. When
both modalities are pruned, tokens are split by modality and each group runs its own pack (gate and
up always share one matmul). `CompactModalityFFN.forward_residual` fuses the decoder layer's
residual add into the kept-channel GEMM (``addmm_``) and the scatter (``index_add_``). The token
indices come from `split_tokens`, one host synchronisation per forward shared by every layer.
`lightprune.width.swap.swap_compact_ffn` swaps it in for every layer a WidthPlan prunes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lightprune.core.checks import check_positive_int
from lightprune.width.paths import MODALITIES, TEXT, VISION

__all__ = ["CompactModalityFFN", "split_tokens"]

_CODES = {"vision": VISION, "text": TEXT}


def split_tokens(modality: torch.Tensor) -> dict[str, torch.Tensor]:
    """Flat token indices of an int [B, T] modality tensor, with one host synchronisation for all of them:
    ``"vision"``, ``"text"``, ``"other"`` (SYSTEM and PAD), ``"not_vision"`` and ``"not_text"``.

    Every layer of one forward sees the same tokens: compute this once and pass it to each
    `CompactModalityFFN.forward` (as `swap_compact_ffn` does)."""
    if not isinstance(modality, torch.Tensor) or modality.dim() != 2:
        got = tuple(modality.shape) if isinstance(modality, torch.Tensor) else type(modality).__name__
        raise ValueError(f"modality must be an int [B, T] tensor, got {got}")
    flat = modality.reshape(-1)
    group = torch.full_like(flat, 2, dtype=torch.long)  # 0 vision, 1 text, 2 other
    group[flat == VISION] = 0
    group[flat == TEXT] = 1
    order = torch.argsort(group, stable=True)
    nv, nt, _ = torch.bincount(group, minlength=3).tolist()
    vision, text, other = order[:nv], order[nv:nv + nt], order[nv + nt:]
    return {"vision": vision, "text": text, "other": other, "not_vision": order[nv:],
            "not_text": torch.cat([vision, other])}


def _linears(mlp: nn.Module) -> tuple[nn.Linear, nn.Linear, nn.Linear, nn.Module]:
    """gate_proj, up_proj, down_proj (plain nn.Linear, consistent shapes) and act_fn of a gated MLP."""
    missing = [n for n in ("gate_proj", "up_proj", "down_proj", "act_fn") if not hasattr(mlp, n)]
    if missing:
        raise TypeError(f"CompactModalityFFN needs a gated MLP with gate_proj, up_proj, down_proj and act_fn; "
                        f"{type(mlp).__name__} lacks {missing}")
    gate, up, down = mlp.gate_proj, mlp.up_proj, mlp.down_proj
    for name, lin in (("gate_proj", gate), ("up_proj", up), ("down_proj", down)):
        if type(lin) is not nn.Linear:
            raise TypeError(f"CompactModalityFFN packs plain nn.Linear weights; {type(mlp).__name__}.{name} is "
                            f"{type(lin).__name__} (merge a LoRA adapter / dequantize before packing)")
    m, d = gate.out_features, gate.in_features
    if (up.out_features, up.in_features, down.in_features, down.out_features) != (m, d, m, d):
        raise ValueError(f"inconsistent gated MLP shapes: gate_proj {tuple(gate.weight.shape)}, up_proj "
                         f"{tuple(up.weight.shape)}, down_proj {tuple(down.weight.shape)}")
    return gate, up, down, mlp.act_fn


class CompactModalityFFN(nn.Module):
    """A gated MLP whose VISION (and, when pruned, TEXT) tokens run packed weights of their kept channels.

    Args:
        mlp: a dense gated MLP (``gate_proj``, ``up_proj``, ``down_proj`` as ``nn.Linear``, ``act_fn``): the
            Qwen2 / LLaVA-OneVision / Qwen2.5-VL decoder MLP. Its Linear modules are shared (registered here
            under the same names, so the full weights keep their state-dict keys), not copied.
        keep: ``{"vision": bool [m], "text": bool [m]}`` (a ``WidthPlan.ffn_keep[l]``); a missing modality
            keeps every channel.
        align: channel alignment b of the packed width ``m~ = min(m, b * ceil(k / b))``.
        share_weights: the ``shared`` layout runs slices of the MLP's weights, permuted in place, instead of packed
            copies (below); other layouts ignore it.

    Layouts (`layout`), chosen by the masks:

    - ``"dense"``: no channel pruned; every token runs the full FFN.
    - ``"shared"`` (one modality pruned, the paper's configurations): buffers ``kept_*`` hold its k kept
      channels padded to m~, ``rest_*`` the other m - k channels. Every token runs ``kept`` (one matmul
      chain over all tokens, no gather); the other tokens (the unpruned modality, SYSTEM, PAD) add
      ``rest``, gathered and scatter-added. Their sum is the full FFN, so each weight is read once per
      call, as in the dense FFN, and the FLOPs are V m~ + (N - V)(m~ + m - k) ~ the D.4 count.
    - ``"grouped"`` (both modalities pruned): each pruned modality's tokens are gathered and run their
      packed ``<modality>_*`` buffers; SYSTEM and PAD run the full FFN; results are scattered back.

    Padding does not change the output: a padded channel has a zero gate row, a zero up row (and zero
    biases), so its activation is ``act(0) * 0 = 0`` for finite inputs, and its down column is zero, so it
    adds exact zeros to every output sum; the kept channels' terms are those of the mask-mode MLP (only
    the GEMMs' summation order and split, chosen by shape and layout, differ at rounding level). The
    packing pays off on hardware whose matmul tiles are multiples of b.

    The packed weights are non-persistent buffers built once, on the MLP's device and dtype, from the
    weights at construction: call `pack` again after the MLP's weights change. The ``shared``
    layout's packs hold every channel (about one more copy of the MLP beside the shared Linear
    modules); ``share_weights=True`` holds none: it permutes the MLP's channels in place (`share`, refused
    ``state_dict`` while so) and runs slices of them, the first m~ channels for every token with the m~ - k
    alignment channels zeroed for the pruned tokens; `restore` puts the order back bitwise. Inference only
    (the packed copies get no gradient).
    """

    def __init__(self, mlp: nn.Module, keep: dict[str, torch.Tensor], align: int = 64, *, share_weights: bool = False):
        super().__init__()
        align = check_positive_int("align", align)
        self.gate_proj, self.up_proj, self.down_proj, self.act_fn = _linears(mlp)
        self.intermediate_size = self.gate_proj.out_features
        self.hidden_size = self.gate_proj.in_features
        self.align = align
        if not isinstance(keep, dict) or not keep or not set(keep) <= set(MODALITIES):
            got = sorted(keep) if isinstance(keep, dict) else type(keep).__name__
            raise ValueError(f"keep must map some of {list(MODALITIES)} to bool channel masks, got {got}")
        self.keep: dict[str, torch.Tensor] = {}
        for mu in MODALITIES:
            mask = keep.get(mu)
            if mask is None:
                mask = torch.ones(self.intermediate_size, dtype=torch.bool)
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or \
                    tuple(mask.shape) != (self.intermediate_size,):
                desc = (f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, torch.Tensor)
                        else type(mask).__name__)
                raise ValueError(f"keep[{mu!r}] must be a bool tensor of shape ({self.intermediate_size},), "
                                 f"got {desc}")
            self.keep[mu] = mask.detach().cpu().clone()
        m = self.intermediate_size
        #: kept channels k_mu; packed width m~_mu (None: the modality keeps every channel)
        self.kept = {mu: int(self.keep[mu].sum()) for mu in MODALITIES}
        self.width = {mu: None if k == m else min(m, align * math.ceil(k / align)) for mu, k in self.kept.items()}
        pruned = [mu for mu in MODALITIES if self.width[mu] is not None]
        self.layout = "dense" if not pruned else "shared" if len(pruned) == 1 else "grouped"
        #: the pruned modality of the shared layout
        self.pruned = pruned[0] if self.layout == "shared" else None
        #: the shared layout runs slices of the MLP's own weights, its channels permuted in place (kept first)
        self.share_weights = bool(share_weights) and self.layout == "shared"
        self._order: torch.Tensor | None = None  # the permutation applied to the MLP's channels, while applied
        self._guards: list = []
        self.pack()

    @classmethod
    def from_mlp(cls, mlp: nn.Module, keep: dict[str, torch.Tensor], align: int = 64, *,
                 share_weights: bool = False) -> "CompactModalityFFN":
        return cls(mlp, keep, align, share_weights=share_weights)

    def pack(self) -> None:
        """(Re)build the packed buffers ``<name>_gate_up`` [2 w, d] (gate rows, then up rows),
        ``<name>_gate_up_bias`` [2 w] and ``<name>_down`` [d, w] of the layout (None for an empty set); with
        ``share_weights``, permute the MLP's channels instead (`share`)."""
        if self.share_weights:
            self.share()
        elif self.layout == "shared":
            mask = self.keep[self.pruned]
            self._store("kept", mask.nonzero().squeeze(1), self.width[self.pruned])
            self._store("rest", (~mask).nonzero().squeeze(1), int((~mask).sum()))
        elif self.layout == "grouped":
            for mu in MODALITIES:
                self._store(mu, self.keep[mu].nonzero().squeeze(1), self.width[mu])

    def share(self) -> None:
        """Permute the MLP's channels in place so the pruned modality's kept ones come first (then the rest, in
        order): the rows of ``gate_proj`` / ``up_proj`` (and biases) and the columns of ``down_proj``. The gated MLP
        is the same function of its input in any channel order; the compact FFN then runs slices of these weights
        (no packed copy). While permuted, ``state_dict`` and ``load_state_dict`` of the three Linear modules are
        refused (the saved channels would not be the model's); `restore` puts them back, bitwise."""
        if self._order is not None:
            return
        mask = self.keep[self.pruned]
        order = torch.cat([mask.nonzero().squeeze(1), (~mask).nonzero().squeeze(1)]).to(self.gate_proj.weight.device)
        self._permute(order)
        self._order = order
        for linear in (self.gate_proj, self.up_proj, self.down_proj):
            self._guards.append(linear.register_state_dict_pre_hook(self._refuse))
            self._guards.append(linear.register_load_state_dict_pre_hook(self._refuse))

    def restore(self) -> None:
        """Undo `share`: the MLP's channels in their original order (idempotent)."""
        if self._order is None:
            return
        self._permute(torch.argsort(self._order))
        self._order = None
        for guard in self._guards:
            guard.remove()
        self._guards = []

    def _permute(self, order: torch.Tensor) -> None:
        order = order.to(self.gate_proj.weight.device)  # the module may have moved since share()
        with torch.no_grad():
            for linear in (self.gate_proj, self.up_proj):
                linear.weight.copy_(linear.weight.index_select(0, order))
                if linear.bias is not None:
                    linear.bias.copy_(linear.bias.index_select(0, order))
            self.down_proj.weight.copy_(self.down_proj.weight.index_select(1, order))

    def _refuse(self, *args, **kwargs) -> None:
        raise RuntimeError("the compact FFN holds this MLP's channels permuted (share_weights): remove the width "
                           "kernels first (model.lightprune_width.remove(), or CompactModalityFFN.restore()) before "
                           "state_dict / save_pretrained / load_state_dict")

    def _store(self, name: str, idx: torch.Tensor, width: int) -> None:
        weight, k = self.gate_proj.weight, idx.numel()
        gate_up = gate_up_bias = down = None
        if k:
            idx = idx.to(weight.device)
            with torch.no_grad():
                gate_up = weight.new_zeros(2 * width, self.hidden_size)
                gate_up[:k] = self.gate_proj.weight.index_select(0, idx)
                gate_up[width:width + k] = self.up_proj.weight.index_select(0, idx)
                down = weight.new_zeros(self.hidden_size, width)
                down[:, :k] = self.down_proj.weight.index_select(1, idx)
                if self.gate_proj.bias is not None or self.up_proj.bias is not None:
                    gate_up_bias = weight.new_zeros(2 * width)
                    if self.gate_proj.bias is not None:
                        gate_up_bias[:k] = self.gate_proj.bias.index_select(0, idx)
                    if self.up_proj.bias is not None:
                        gate_up_bias[width:width + k] = self.up_proj.bias.index_select(0, idx)
        self.register_buffer(f"{name}_gate_up", gate_up, persistent=False)
        self.register_buffer(f"{name}_gate_up_bias", gate_up_bias, persistent=False)
        self.register_buffer(f"{name}_down", down, persistent=False)

    def extra_repr(self) -> str:
        return (f"d={self.hidden_size}, m={self.intermediate_size}, align={self.align}, layout={self.layout!r}, "
                f"kept={self.kept}, packed_width={self.width}")

    # ------------------------------------------------------------------ compute
    def _full(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    def _hidden(self, name: str, x: torch.Tensor) -> torch.Tensor | None:
        """The gated activation of pack ``name`` [n, w]; None for an empty pack (no matmul)."""
        gate_up = getattr(self, f"{name}_gate_up")
        if gate_up is None:
            return None
        if gate_up.device != x.device:
            raise RuntimeError(f"CompactModalityFFN: packed {name!r} weights are on {gate_up.device}, the input on "
                               f"{x.device}; move the module (or repack) where it runs")
        gate, up = F.linear(x, gate_up, getattr(self, f"{name}_gate_up_bias")).chunk(2, dim=-1)
        return self.act_fn(gate) * up

    def _packed(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """``down_proj`` of pack ``name``; an empty pack is ``down_proj(0)`` (zeros or the bias), no matmul."""
        h = self._hidden(name, x)
        if h is None:
            out = x.new_zeros(x.shape[:-1] + (self.hidden_size,))
            return out if self.down_proj.bias is None else out + self.down_proj.bias
        return F.linear(h, getattr(self, f"{name}_down"), self.down_proj.bias)

    def _sliced(self, x: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """The gated activation of the permuted MLP's channels ``[start, end)`` (share_weights) [n, end - start]."""
        gate, up = self.gate_proj, self.up_proj
        g = F.linear(x, gate.weight[start:end], None if gate.bias is None else gate.bias[start:end])
        return self.act_fn(g) * F.linear(x, up.weight[start:end], None if up.bias is None else up.bias[start:end])

    def _run_sliced(self, flat: torch.Tensor, split: dict, residual: torch.Tensor | None):
        """The shared layout on the permuted MLP: every token runs channels ``[0, m~)`` (the k kept ones, then the
        first m~ - k others, zeroed for the pruned modality's tokens), the other tokens add ``[m~, m)``."""
        if self._order is None:
            raise RuntimeError("CompactModalityFFN(share_weights=True) was restored: call share() to run it again")
        k, width, m = self.kept[self.pruned], self.width[self.pruned], self.intermediate_size
        down, bias = self.down_proj.weight, self.down_proj.bias
        out = residual.clone() if residual is not None else None
        if width:
            h = self._sliced(flat, 0, width)
            pruned = split[self.pruned]
            if width > k and pruned.numel():
                h[:, k:].index_fill_(0, pruned, 0.0)  # the alignment's extra channels are not the pruned tokens'
            if out is None:
                out = F.linear(h, down[:, :width], bias)
            else:
                out.addmm_(h, down[:, :width].t())
                if bias is not None:
                    out += bias
        else:  # nothing kept: down_proj(0) for the pruned tokens, no matmul
            if out is None:
                out = flat.new_zeros(flat.shape)
            if bias is not None:
                out += bias
        idx = split["not_" + self.pruned]
        if width < m and idx.numel():
            if idx.numel() == flat.shape[0]:
                out.addmm_(self._sliced(flat, width, m), down[:, width:].t())
            else:
                out.index_add_(0, idx, F.linear(self._sliced(flat.index_select(0, idx), width, m), down[:, width:]))
        return out

    def _run_shared(self, flat: torch.Tensor, split: dict, residual: torch.Tensor | None):
        if not split[self.pruned].numel():  # no token of the pruned modality (text-only decoding): the dense MLP
            y = self._full(flat)
            return y if residual is None else residual + y
        if self.share_weights:
            return self._run_sliced(flat, split, residual)
        h = self._hidden("kept", flat)  # every token runs the kept channels
        if residual is None:
            out = self._packed("kept", flat) if h is None else F.linear(h, self.kept_down, self.down_proj.bias)
        else:
            out = residual.clone()
            if h is not None:
                out.addmm_(h, self.kept_down.t())  # the residual add fused into the GEMM
            if self.down_proj.bias is not None:
                out += self.down_proj.bias
        idx = split["not_" + self.pruned]
        if idx.numel() == flat.shape[0]:
            out.addmm_(self._hidden("rest", flat), self.rest_down.t())
        elif idx.numel():
            rest = F.linear(self._hidden("rest", flat.index_select(0, idx)), self.rest_down)
            out.index_add_(0, idx, rest)
        return out

    def _run_grouped(self, flat: torch.Tensor, split: dict, residual: torch.Tensor | None):
        out = torch.empty_like(flat) if residual is None else residual.clone()
        for name in ("other", *MODALITIES):
            idx = split[name]
            if not idx.numel():
                continue
            xs = flat if idx.numel() == flat.shape[0] else flat.index_select(0, idx)
            y = self._full(xs) if name == "other" else self._packed(name, xs)
            if residual is None:
                out.index_copy_(0, idx, y)
            else:
                out.index_add_(0, idx, y)
        return out

    def _run(self, x: torch.Tensor, modality: torch.Tensor, residual: torch.Tensor | None,
             split: dict | None) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.hidden_size:
            raise ValueError(f"CompactModalityFFN input must be [B, T, {self.hidden_size}], got {tuple(x.shape)}")
        if not isinstance(modality, torch.Tensor) or tuple(modality.shape) != tuple(x.shape[:2]):
            got = tuple(modality.shape) if isinstance(modality, torch.Tensor) else type(modality).__name__
            raise ValueError(f"modality must be an int [B, T] = {tuple(x.shape[:2])} tensor, got {got}")
        if residual is not None and residual.shape != x.shape:
            raise ValueError(f"residual {tuple(residual.shape)} must match the input {tuple(x.shape)}")
        if self.layout == "dense":
            y = self._full(x)
            return y if residual is None else residual + y
        if split is None:
            split = split_tokens(modality.to(x.device))
        elif sum(split[k].numel() for k in ("vision", "text", "other")) != modality.numel():
            raise ValueError(f"split holds {sum(split[k].numel() for k in ('vision', 'text', 'other'))} tokens, the "
                             f"input {modality.numel()}: pass split_tokens(modality) of these tokens")
        flat = x.reshape(-1, self.hidden_size)
        res = None if residual is None else residual.reshape(-1, self.hidden_size)
        run = self._run_shared if self.layout == "shared" else self._run_grouped
        return run(flat, split, res).view(x.shape)

    def forward(self, x: torch.Tensor, modality: torch.Tensor, split: dict | None = None) -> torch.Tensor:
        """FFN(x) [B, T, d] with each token on its modality's weights (``modality`` int [B, T] codes of
        `lightprune.width.layers`; ``split`` its `split_tokens`, computed here when not given)."""
        return self._run(x, modality, None, split)

    def forward_residual(self, x: torch.Tensor, residual: torch.Tensor, modality: torch.Tensor,
                         split: dict | None = None) -> torch.Tensor:
        """``residual + FFN(x)`` with the add fused into the kernels: the ``shared`` layout accumulates the
        kept-channel GEMM into a copy of the residual (``addmm_``) and scatter-adds the rest; ``grouped``
        scatter-adds each group (``index_add_``). Equal to ``residual + forward(x)`` up to rounding."""
        return self._run(x, modality, residual, split)

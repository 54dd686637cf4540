"""Per-layer accumulators of every calibration criterion, for every token subset, in one pass.

For one MoE layer and one batch the observer gets the tokens' hidden states h [T, H], the
selected experts S [T, k], the weights applied w [T, k] and the selected experts' unweighted
outputs f [T, k, H]. From these (METHODS.md, "Calibration criteria"):

- token-level sums over a subset's tokens: n_j (frequency), sum g_j (seer), sum ||f_j|| (ean),
  sum g_j ||f_j|| (REAP's numerator), sum KL(p || p^(-j)) (routing_kl, MAEP eq. 8);
- Delta-H (MAEP eq. 2): H = sum_s w_s f_s; the family's selection is re-run from the same router
  logits with expert j masked (all j of a chunk in one call, one mask per row),
  giving S', w'; the survivors keep their outputs, a promoted expert (in S' but not S) adds
  nothing. With D_s = w_s - sum_{s' : S'_s' = S_s} w'_s' the change is H - H^(-j) = sum_s D_s f_s,
  so ||H - H^(-j)||^2 = D^T G D with the Gram matrix G = f f^T [T, k, k], computed once per
  batch: no expert runs again and no [T, E, H] tensor is formed. Per sample, the mean over the
  sample's subset tokens; summed over samples that have such tokens.
- ``delta_h_promoted`` also evaluates the promoted expert: ||sum_s D_s f_s - sum_p w'_p f_p(h)||^2.

Everything accumulates in float64 on the weights' device with no host synchronisation (the
optional promoted variant gathers the promoted tokens, which needs their count).
"""

from __future__ import annotations

import torch

from lightprune.models import MoELayer
from lightprune.observe.experts_impl import run_expert

__all__ = ["LayerAccumulator", "KL_EPS", "router_distribution"]

KL_EPS = 1e-12
_TOKEN_SUMS = ("frequency", "seer", "ean", "reap_num", "routing_kl")
#: logits elements per masked-selection call in Delta-H (bounds memory: chunk x T x E)
_CHUNK_ELEMENTS = 1 << 22


def router_distribution(layer: MoELayer, logits: torch.Tensor) -> torch.Tensor:
    """The router's distribution p over all experts [T, E] (float64): softmax of the logits, or for a
    sigmoid router (DeepSeek-V3) the sigmoid scores normalised to sum to 1."""
    logits = logits.double()
    if getattr(layer.family, "score_function", "softmax") == "sigmoid":
        scores = logits.sigmoid()
        return scores / scores.sum(dim=-1, keepdim=True)
    return torch.softmax(logits, dim=-1)


def routing_kl(p: torch.Tensor, eps: float = KL_EPS) -> torch.Tensor:
    """KL(p || p^(-j)) for every j [T, E]: p^(-j) zeroes p_j and renormalises; both sides get Laplace
    smoothing (add eps, renormalise), as MAEP eq. (8) does. Chunked over tokens ([chunk, E, E])."""
    num_tokens, num = p.shape
    z = 1.0 + num * eps
    ps = (p + eps) / z                                              # [T, E]
    entropy_term = (ps * ps.log()).sum(dim=-1, keepdim=True)        # sum_i ps_i log ps_i
    off_diagonal = 1.0 - torch.eye(num, dtype=p.dtype, device=p.device)
    out = torch.empty_like(p)
    step = max(1, _CHUNK_ELEMENTS // (num * num))
    for start in range(0, num_tokens, step):
        pc = p[start:start + step]
        q = pc.unsqueeze(1) / (1.0 - pc).clamp_min(1e-300).unsqueeze(-1) * off_diagonal   # [t, j, i]
        cross = torch.einsum("ti,tji->tj", ps[start:start + step], ((q + eps) / z).log())
        out[start:start + step] = entropy_term[start:start + step] - cross
    return out


class LayerAccumulator:
    """Sums for one MoE layer over ``subsets``; ``criteria`` decides what is computed."""

    def __init__(self, layer: MoELayer, subsets: tuple[str, ...], criteria: tuple[str, ...]):
        self.index, self.num_experts, self.subsets, self.criteria = layer.index, layer.num_experts, subsets, criteria
        device = layer.router_linear.weight.device
        zeros = lambda: torch.zeros(len(subsets), layer.num_experts, dtype=torch.float64, device=device)  # noqa: E731
        self.sums: dict[str, torch.Tensor] = {name: zeros() for name in _TOKEN_SUMS}
        self.sums["delta_h"] = zeros()
        self.sums["delta_h_promoted"] = zeros()
        self.sums["tokens"] = torch.zeros(len(subsets), dtype=torch.float64, device=device)
        self.sums["samples"] = torch.zeros(len(subsets), dtype=torch.float64, device=device)

    # ------------------------------------------------------------------ update
    @torch.no_grad()
    def update(self, layer: MoELayer, hidden: torch.Tensor, selected: torch.Tensor, weights: torch.Tensor,
               outputs: torch.Tensor, masks: torch.Tensor, samples: torch.Tensor, num_samples: int,
               router_input: torch.Tensor | None = None) -> None:
        """Add one batch. ``masks`` [n_subsets, T] bool (padding already excluded), ``samples`` [T]
        the sample index of each token; ``router_input`` [T, H] what the router saw (default: ``hidden``, the
        experts' input), from which routing-KL and Delta-H recompute the router's logits."""
        num_experts = self.num_experts
        # Tokens in no subset (padding) are masked by multiplication below, and 0 * NaN = NaN: the
        # model may leave non-finite values at padded positions, so zero them first (no host sync).
        keep = masks.any(dim=0)                                          # [T]
        hidden = torch.where(keep.unsqueeze(-1), hidden, torch.zeros((), dtype=hidden.dtype, device=hidden.device))
        if router_input is None:
            router_input = hidden
        else:
            router_input = torch.where(keep.unsqueeze(-1), router_input,
                                       torch.zeros((), dtype=router_input.dtype, device=router_input.device))
        weights = torch.where(keep.unsqueeze(-1), weights, torch.zeros((), dtype=weights.dtype, device=weights.device))
        outputs = torch.where(keep.view(-1, 1, 1), outputs, torch.zeros((), dtype=outputs.dtype, device=outputs.device))
        m = masks.double()                                               # [U, T]
        w = weights.double() * layer.family.output_scale(layer)  # the weight each output gets in the block
        gram = torch.bmm(outputs.float(), outputs.float().transpose(1, 2)).double()   # [T, k, k]: f_s . f_r
        norms = gram.diagonal(dim1=1, dim2=2).clamp_min(0).sqrt()        # ||f_s||  [T, k]
        dense = torch.zeros(hidden.shape[0], 4, num_experts, dtype=torch.float64, device=hidden.device)
        per_slot = torch.stack([torch.ones_like(w), w, norms, w * norms], dim=1)   # [T, 4, k]
        dense.scatter_add_(2, selected.unsqueeze(1).expand(-1, 4, -1), per_slot)
        token_sums = torch.einsum("ut,tce->uce", m, dense)               # [U, 4, E]
        for c, name in enumerate(("frequency", "seer", "ean", "reap_num")):
            self.sums[name] += token_sums[:, c]
        self.sums["tokens"] += m.sum(dim=1)
        counts = torch.zeros(len(self.subsets), num_samples, dtype=torch.float64, device=hidden.device)
        counts.index_add_(1, samples, m)                                 # [U, B] subset tokens per sample
        self.sums["samples"] += (counts > 0).double().sum(dim=1)
        want_dh = "delta_h" in self.criteria
        want_promoted = "delta_h_promoted" in self.criteria
        if not ("routing_kl" in self.criteria or want_dh or want_promoted):
            return
        logits = layer.family.router_logits(layer, router_input)
        if "routing_kl" in self.criteria:
            self.sums["routing_kl"] += m @ routing_kl(router_distribution(layer, logits))
        if want_dh or want_promoted:
            per_sample = torch.zeros(len(self.subsets), num_samples, hidden.shape[0], dtype=torch.float64,
                                     device=hidden.device)
            per_sample[:, samples, torch.arange(hidden.shape[0], device=hidden.device)] = m
            weight = per_sample / counts.clamp_min(1).unsqueeze(-1)       # mean over a sample's tokens
            dh, dhp = self._delta_h(layer, hidden, logits, selected, w, outputs, gram, want_promoted)
            if want_dh:
                self.sums["delta_h"] += torch.einsum("ubt,te->ue", weight, dh)
            if want_promoted:
                self.sums["delta_h_promoted"] += torch.einsum("ubt,te->ue", weight, dhp)

    def _delta_h(self, layer: MoELayer, hidden: torch.Tensor, logits: torch.Tensor, selected: torch.Tensor,
                 w: torch.Tensor, outputs: torch.Tensor, gram: torch.Tensor,
                 promoted: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """dh [T, E] (and the promoted variant): the family's selection re-run from the same logits with
        each expert masked in turn, a chunk of experts at a time (one selection call per chunk)."""
        num_tokens, num_experts = logits.shape
        f = outputs.double() if promoted else None
        dh = torch.empty(num_tokens, num_experts, dtype=torch.float64, device=hidden.device)
        dhp = torch.empty_like(dh) if promoted else None
        eye = torch.eye(num_experts, dtype=torch.bool, device=logits.device)
        chunk = max(1, _CHUNK_ELEMENTS // max(1, num_tokens * num_experts))
        for first in range(0, num_experts, chunk):
            js = range(first, min(first + chunk, num_experts))
            n = len(js)
            rows = logits.unsqueeze(0).expand(n, -1, -1).reshape(n * num_tokens, num_experts)
            mask = eye[first:first + n].unsqueeze(1).expand(-1, num_tokens, -1).reshape(n * num_tokens, num_experts)
            _, w_new, s_new = layer.family.select(layer, rows, mask)
            w_new = w_new.view(n, num_tokens, -1).double() * layer.family.output_scale(layer)
            s_new = s_new.view(n, num_tokens, -1)
            match = (s_new.unsqueeze(3) == selected.unsqueeze(0).unsqueeze(2)).double()   # [J, T, k', k]
            diff = w.unsqueeze(0) - torch.einsum("jtp,jtps->jts", w_new, match)          # D [J, T, k]
            dh[:, first:first + n] = torch.einsum("jts,tsr,jtr->tj", diff, gram, diff)
            if dhp is not None:
                for i, j in enumerate(js):
                    dhp[:, j] = self._with_promoted(layer, hidden, s_new[i], w_new[i], match[i], diff[i], f, dh[:, j])
        return dh, dhp

    @staticmethod
    def _with_promoted(layer: MoELayer, hidden: torch.Tensor, s_new: torch.Tensor, w_new: torch.Tensor,
                       match: torch.Tensor, diff: torch.Tensor, f: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        """||sum_s D_s f_s - P||^2 with P the promoted experts' weighted outputs."""
        is_new = match.sum(dim=2) == 0                                    # [T, k'] slot holds a promoted expert
        tok, slot = is_new.nonzero(as_tuple=True)
        if tok.numel() == 0:
            return base
        contrib = torch.zeros(hidden.shape[0], f.shape[-1], dtype=torch.float64, device=hidden.device)
        experts = s_new[tok, slot]
        for e in experts.unique().tolist():
            pick = experts == e
            out = run_expert(layer.experts, e, hidden[tok[pick]]).double()
            contrib.index_add_(0, tok[pick], out * w_new[tok[pick], slot[pick]].double().unsqueeze(-1))
        change = torch.einsum("ts,tsh->th", diff, f)
        return (change - contrib).pow(2).sum(dim=-1)

    # ------------------------------------------------------------------ results
    def values(self) -> dict[tuple[str, str], torch.Tensor]:
        """{(criterion, subset): tensor[E]} for the configured criteria."""
        s = self.sums
        out: dict[tuple[str, str], torch.Tensor] = {}
        for u, subset in enumerate(self.subsets):
            freq = s["frequency"][u]
            derived = {
                "frequency": freq,
                "seer": s["seer"][u],
                "ean": s["ean"][u],
                "reap": torch.where(freq > 0, s["reap_num"][u] / freq.clamp_min(1), torch.zeros_like(freq)),
                "routing_kl": s["routing_kl"][u] / s["tokens"][u].clamp_min(1),
                "delta_h": s["delta_h"][u] / s["samples"][u].clamp_min(1),
                "delta_h_promoted": s["delta_h_promoted"][u] / s["samples"][u].clamp_min(1),
            }
            for name in self.criteria:
                out[(name, subset)] = derived[name]
        return out

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: t.clone() for name, t in self.sums.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name, t in self.sums.items():
            if name not in state or state[name].shape != t.shape:
                raise ValueError(f"layer {self.index}: calibration state has no {name!r} of shape {tuple(t.shape)}")
            t.copy_(state[name])



"""Per-layer accumulators of every calibration criterion, for every token subset, in one pass.

For one MoE layer and one batch the observer gets the tokens' hidden states h [T, H], the
selected experts S [T, k], the weights applied w [T, k] and the selected experts' unweighted
outputs f [T, k, H]. From these (METHODS.md, "Calibration criteria"):

- token-level sums over a subset's tokens: n_j (frequency), sum g_j (seer), sum ||f_j|| (ean),
  sum g_j ||f_j|| (REAP's numerator), sum KL(p || p^(-j)) (routing_kl, MAEP eq. 8);
- Delta-H (MAEP eq. 2): H = sum_s w_s f_s; for the (token, expert) pairs whose removal can change the
  token's routing (the family's ``removal_effect``: its selected experts, and a group-limited router's group
  leaders) the family's selection is re-run from the same router logits with expert j masked (a chunk of
  pairs per call, one mask per row), giving S', w'; the survivors keep their outputs, a promoted expert (in S'
  but not S) adds nothing. With D_s = w_s - sum_{s' : S'_s' = S_s} w'_s' the change is H - H^(-j) =
  sum_s D_s f_s, so ||H - H^(-j)||^2 = D^T G D with the Gram matrix G = f f^T [T, k, k], computed once per
  batch: no expert runs again and no [T, E, H] tensor is formed. Per sample, the mean over the
  sample's subset tokens; summed over samples that have such tokens. Any other removal scales H by the
  family's closed-form factor c (1 for a renormalised router, 1 / (1 - p_j) for a plain softmax), so
  ||H - H^(-j)||^2 = (c - 1)^2 ||H||^2 with ||H||^2 = w^T G w.
- ``delta_h_promoted`` also evaluates the promoted expert: ||sum_s D_s f_s - sum_p w'_p f_p(h)||^2.

Everything accumulates in float64 on the weights' device; the host synchronises only on counts (routing KL's
pairs that need an exact sum, a group-limited router's distinct candidates, the promoted tokens).
"""

from __future__ import annotations

import math

import torch

from lightprune.models import MoELayer
from lightprune.observe.experts_impl import run_expert

__all__ = ["LayerAccumulator", "KL_EPS", "router_distribution"]

KL_EPS = 1e-12
_TOKEN_SUMS = ("frequency", "seer", "ean", "reap_num", "routing_kl")
#: elements per masked-selection call in Delta-H (bounds memory: rows x E logits, rows x k x H promoted outputs)
_CHUNK_ELEMENTS = 1 << 22


def router_distribution(layer: MoELayer, logits: torch.Tensor) -> torch.Tensor:
    """The router's distribution p over all experts [T, E] (float64): softmax of the logits, or for a
    sigmoid router (DeepSeek-V3) the sigmoid scores normalised to sum to 1."""
    logits = logits.double()
    if getattr(layer.family, "score_function", "softmax") == "sigmoid":
        scores = logits.sigmoid()
        return scores / scores.sum(dim=-1, keepdim=True)
    return torch.softmax(logits, dim=-1)


#: the largest x_ij = eps p_j / (p_i + eps) left to routing_kl's series (4 terms: the rest is below x^5 / 5)
_KL_SERIES_X = 1e-2


def routing_kl(p: torch.Tensor, eps: float = KL_EPS) -> torch.Tensor:
    """KL(p || p^(-j)) for every j [T, E]: p^(-j) zeroes p_j and renormalises; both sides get Laplace
    smoothing (add eps, renormalise), as MAEP eq. (8) does. In O(T E) for every expert at once.

    With ps = (p + eps) / z, z = 1 + E eps, a_j = 1 / (1 - p_j) and L_i = log(p_i + eps):
    KL_j = sum_i ps_i log ps_i + log z - (1 - ps_j) log a_j - (S - ps_j L_j) - ps_j log eps - R_j, with
    S = sum_i ps_i L_i and R_j = sum_{i != j} ps_i log(1 - x_ij), x_ij = eps p_j / (p_i + eps). Since
    ps_i x_ij^n = (eps p_j)^n (p_i + eps)^(1 - n) / z, R_j is the series -(1/z) sum_n c^n / n M_(n-1), c = eps p_j,
    M_m = sum_{i != j} (p_i + eps)^-m, to four terms where every x_ij <= 1e-2; the few (token, expert) pairs with
    a larger x_ij (a near-certain expert j over experts below eps) are summed exactly.
    """
    num_tokens, num = p.shape
    z = 1.0 + num * eps
    ps = (p + eps) / z
    entropy_term = (ps * ps.log()).sum(dim=-1, keepdim=True)                 # sum_i ps_i log ps_i
    big_l = (p + eps).log()
    total = (ps * big_l).sum(dim=-1, keepdim=True)                            # S
    one_minus = (1.0 - p).clamp_min(1e-300)                                   # 1 / a_j
    log_a = -one_minus.log()
    c = eps * (1.0 - one_minus)                                               # eps p_j
    inv = 1.0 / (p + eps)
    rest = c * (num - 1)
    power = torch.ones_like(inv)
    for n in (2, 3, 4):                                                       # c^n / n * M_(n-1), i != j
        power = power * inv
        rest = rest + c.pow(n) / n * (power.sum(dim=-1, keepdim=True) - power)
    rest = -rest / z
    top2 = inv.topk(min(2, num), dim=-1).values                               # the largest 1 / (p_i + eps), i != j
    largest = torch.where(inv == top2[:, :1], top2[:, -1:], top2[:, :1])
    exact = c * largest > _KL_SERIES_X
    if bool(exact.any()):
        t, j = exact.nonzero(as_tuple=True)
        rest[t, j] = _exact_rest(p, ps, big_l, one_minus, t, j, eps)
    cross = -math.log(z) + (1.0 - ps) * log_a + (total - ps * big_l) + ps * math.log(eps) + rest
    return entropy_term - cross


def _exact_rest(p: torch.Tensor, ps: torch.Tensor, big_l: torch.Tensor, one_minus: torch.Tensor, t: torch.Tensor,
                j: torch.Tensor, eps: float) -> torch.Tensor:
    """R_j = sum_{i != j} ps_i (log(p_i + eps (1 - p_j)) - L_i) for the (token t, expert j) pairs, exactly."""
    num = p.shape[1]
    out = torch.empty(t.numel(), dtype=p.dtype, device=p.device)
    step = max(1, _CHUNK_ELEMENTS // num)
    for start in range(0, t.numel(), step):
        tt, jj = t[start:start + step], j[start:start + step]
        shifted = (p[tt] + eps * one_minus[tt, jj].unsqueeze(-1)).log()            # [n, E]
        terms = ps[tt] * (shifted - big_l[tt])
        terms[torch.arange(tt.numel(), device=p.device), jj] = 0.0
        out[start:start + step] = terms.sum(dim=-1)
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
        """dh [T, E] (and the promoted variant).

        The family says which removals can change a token's routing (:meth:`MoEFamily.removal_effect`): for
        those (token, expert) pairs the selection is re-run from the same logits with the expert masked, a chunk
        of pairs per selection call (one mask per row); every other removal keeps the selection and scales the
        weights by a factor c, so H^(-j) = c H and dh = (c - 1)^2 ||H||^2 with ||H||^2 = w^T G w. Cost: tokens x
        candidates selections instead of tokens x E.
        """
        num_tokens, num_experts = logits.shape
        candidates, scale = layer.family.removal_effect(layer, logits, selected)
        if scale is None:
            dh = torch.zeros(num_tokens, num_experts, dtype=torch.float64, device=hidden.device)
        else:
            norm2 = torch.einsum("ts,tsr,tr->t", w, gram, w)             # ||H_t||^2
            dh = (scale.to(device=hidden.device, dtype=torch.float64) - 1.0).pow(2) * norm2.unsqueeze(-1)
        dhp = dh.clone() if promoted else None
        f = outputs.double() if promoted else None
        per_row = max(num_experts, gram.shape[-1] * (outputs.shape[-1] if promoted else 1))
        step = max(1, _CHUNK_ELEMENTS // per_row)
        tokens = torch.arange(num_tokens, device=logits.device).repeat_interleave(candidates.shape[1])
        experts = candidates.reshape(-1).to(logits.device)
        output_scale = layer.family.output_scale(layer)
        for start in range(0, tokens.numel(), step):
            t, j = tokens[start:start + step], experts[start:start + step]
            mask = torch.zeros(t.numel(), num_experts, dtype=torch.bool, device=logits.device)
            mask[torch.arange(t.numel(), device=logits.device), j] = True
            _, w_new, s_new = layer.family.select(layer, logits[t], mask)
            w_new = w_new.double() * output_scale
            match = (s_new.unsqueeze(2) == selected[t].unsqueeze(1)).double()    # [n, k', k]
            diff = w[t] - torch.einsum("np,nps->ns", w_new, match)               # D [n, k]
            t_out, j_out = t.to(dh.device), j.to(dh.device)
            dh[t_out, j_out] = torch.einsum("ns,nsr,nr->n", diff, gram[t], diff)
            if dhp is not None:
                dhp[t_out, j_out] = self._with_promoted(layer, hidden[t], s_new, w_new, match, diff, f[t])
        return dh, dhp

    @staticmethod
    def _with_promoted(layer: MoELayer, hidden: torch.Tensor, s_new: torch.Tensor, w_new: torch.Tensor,
                       match: torch.Tensor, diff: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """||sum_s D_s f_s - P||^2 per row, with P the promoted experts' weighted outputs."""
        change = torch.einsum("ns,nsh->nh", diff, f)
        is_new = match.sum(dim=2) == 0                                    # [n, k'] slot holds a promoted expert
        row, slot = is_new.nonzero(as_tuple=True)
        if row.numel():
            experts = s_new[row, slot]
            order = torch.argsort(experts, stable=True)                   # one pass: rows grouped by expert
            start = 0
            for e, count in enumerate(torch.bincount(experts, minlength=layer.num_experts).tolist()):
                if count:
                    pick = order[start:start + count]
                    out = run_expert(layer.experts, e, hidden[row[pick]]).double()
                    change.index_add_(0, row[pick], -out * w_new[row[pick], slot[pick]].unsqueeze(-1))
                    start += count
        return change.pow(2).sum(dim=-1)

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



"""Per-layer accumulators of every calibration criterion, for every token subset, in one pass.

For one MoE layer and one batch the observer gets the tokens' hidden states h [T, H], the
selected experts S [T, k], the weights applied w [T, k] and the selected experts' unweighted
outputs f [T, k, H]. From these (METHODS.md, "Calibration criteria"):

- token-level sums over a subset's tokens: n_j (frequency), sum g_j (seer), sum ||f_j|| (ean),
  sum g_j ||f_j|| (REAP's numerator), sum KL(p || p^(-j)) (routing_kl, MAEP eq. 8);
- Delta-H (MAEP eq. 2): H = sum_s w_s f_s. Removing expert j gives a new selection S', w'; the survivors keep
  their outputs, a promoted expert (in S' but not S) adds nothing. With D_s = w_s - sum_{s' : S'_s' = S_s} w'_s'
  the change is H - H^(-j) = sum_s D_s f_s, so ||H - H^(-j)||^2 = D^T G D with the Gram matrix G = f f^T
  [T, k, k], computed once per batch: no expert runs again and no [T, E, H] tensor is formed. S', w' come from
  the family's :class:`~lightprune.models.RemovalEffect`: a closed-form swap for a selected j (the others
  scaled by 1 + factor, one expert entering), a growth factor 1 + g for any other j (g = 0 for a renormalised
  router, p_j / (1 - p_j) for a plain softmax; ||H - H^(-j)||^2 = g^2 ||H||^2 with ||H||^2 = w^T G w), and
  for the pairs without a closed form the family's selection re-run from the same router logits
  (:meth:`~lightprune.models.MoEFamily.select_without`, a chunk of pairs per call). Per sample, the mean over
  the sample's subset tokens; summed over samples that have such tokens.
- ``delta_h_promoted`` also evaluates the promoted experts: ||sum_s D_s f_s - sum_p w'_p f_p(h)||^2. A swap's
  entering expert is the same whichever selected expert leaves, so it runs once per token, in the forward's own
  expert call (:meth:`LayerAccumulator.prepare` asks for it), and the square is expanded:
  D^T G D - 2 w' D . (f . f_n) + w'^2 ||f_n||^2; a re-run pair's entering experts run once per distinct
  (token, expert), also when a swap of the same token promotes the same expert.

Per-token quantities are computed in float32 (the outputs' dtype or wider) and each batch's sums are added
to float64 accumulators [subsets, E] on the weights' device: no float64 tensor over tokens. The host
synchronises only on counts (the re-run pairs, the distinct promoted pairs); padded positions, where a model may
leave non-finite values, are zeroed only in batches with padding (the observer reads that once per batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from lightprune.models import MoELayer, RemovalEffect
from lightprune.observe.experts_impl import expert_rows

__all__ = ["LayerAccumulator", "KL_EPS", "router_distribution"]

KL_EPS = 1e-12
_TOKEN_SUMS = ("frequency", "seer", "ean", "reap_num", "routing_kl")
#: elements per masked-selection call in Delta-H (bounds memory: rows x E logits, rows x H promoted changes)
_CHUNK_ELEMENTS = 1 << 22


def _compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """float32, or the tensor's dtype when it is wider (a float64 reference stays float64)."""
    return torch.promote_types(tensor.dtype, torch.float32)


def _has_padding(keep: torch.Tensor, padded: bool | None) -> bool:
    """``padded`` when the caller knows it, else whether any token is outside ``keep`` (one host sync)."""
    return not bool(keep.all()) if padded is None else padded


def router_distribution(layer: MoELayer, logits: torch.Tensor) -> torch.Tensor:
    """The router's distribution p over all experts [T, E] (float32 or wider): softmax of the logits, or for a
    sigmoid router (DeepSeek-V3) the sigmoid scores normalised to sum to 1."""
    logits = logits.to(_compute_dtype(logits))
    if getattr(layer.family, "score_function", "softmax") == "sigmoid":
        scores = logits.sigmoid()
        return scores / scores.sum(dim=-1, keepdim=True)
    return torch.softmax(logits, dim=-1)


def routing_kl(p: torch.Tensor, eps: float = KL_EPS) -> torch.Tensor:
    """KL(p || p^(-j)) for every j [T, E] (p's dtype): p^(-j) zeroes p_j and renormalises; both sides get Laplace
    smoothing (add eps, renormalise by z = 1 + E eps), as MAEP eq. (8) does. O(T E), no cancellation.

    With ps = (p + eps) / z and r_j = 1 - p_j, the pairs i != j contribute
    ps_i log((p_i + eps) r_j / (p_i + eps r_j)) = ps_i (log r_j + log1p(x_ij)), x_ij = eps p_j / (p_i + eps r_j), so

        KL_j = ps_j log1p(p_j / eps) + (1 - ps_j) log r_j + R_j,   1 - ps_j = (r_j + (E - 1) eps) / z,

    and R_j = sum_{i != j} ps_i log1p(x_ij) is taken to first order with p_i + eps r_j ~ p_i + eps, where
    ps_i / (p_i + eps) = 1 / z: R_j ~ eps p_j (E - 1) / z. What that leaves out is below E eps (1 + |log r_j|)
    in absolute terms (about 1e-8 for 256 experts), against KL_j ~ p_j log(p_j / eps). r_j of the most probable
    expert is the sum of the others (exact where 1 - p_j rounds to 0), the others' log r_j is log1p(-p_j).
    """
    num = p.shape[-1]
    top = p.max(dim=-1, keepdim=True).indices
    rest_top = p.scatter(-1, top, 0.0).sum(dim=-1, keepdim=True).clamp_min_(torch.finfo(p.dtype).tiny)
    # z KL_j = (p_j + eps) log1p(p_j / eps) + (r_j + (E - 1) eps) log r_j + eps (E - 1) p_j, in place past the
    # first buffer of each factor (a fresh [T, E] buffer costs its page faults on a CPU)
    kl = torch.mul(p, 1.0 / eps).log1p_().mul_(p + eps)
    log_rest = torch.neg(p).log1p_().scatter_(-1, top, rest_top.log())
    weight = torch.sub(1.0 + (num - 1) * eps, p).scatter_(-1, top, rest_top + (num - 1) * eps)
    kl.addcmul_(weight, log_rest)
    return kl.add_(p, alpha=eps * (num - 1)).mul_(1.0 / (1.0 + num * eps))


@dataclass(eq=False)
class _Reruns:
    """A :class:`RemovalEffect`'s re-run pairs with their new selections (``weights`` before ``output_scale``), and
    the distinct (token, expert) pairs that enter (``pair_token``, ``pair_expert``; slot (``row``, ``col``) of the
    new selection holds pair ``inverse``); ``alias``: a second removed expert per pair with the same effect (-1 none),
    or None."""

    tokens: torch.Tensor
    experts: torch.Tensor
    alias: torch.Tensor | None
    weights: torch.Tensor
    selected: torch.Tensor
    row: torch.Tensor
    col: torch.Tensor
    pair_token: torch.Tensor
    pair_expert: torch.Tensor
    inverse: torch.Tensor


def _reselect(layer: MoELayer, logits: torch.Tensor, selected: torch.Tensor, effect: RemovalEffect,
              entering: bool) -> _Reruns:
    """The family's selection without each re-run pair's expert (the effect's own, else ``select_without``, a chunk
    of pairs per call), and with ``entering`` the distinct (token, expert) pairs that enter (none without)."""
    t_all, slot = (effect.rerun >= 0).nonzero(as_tuple=True)
    flat = t_all * effect.rerun.shape[1] + slot

    def at(tensor: torch.Tensor) -> torch.Tensor:  # tensor[t_all, slot], by index_select (faster on a CPU)
        return tensor.flatten(0, 1).index_select(0, flat.to(tensor.device)).to(logits.device)

    j_all, t_all = at(effect.rerun), t_all.to(logits.device)
    alias = None if effect.rerun_alias is None else at(effect.rerun_alias)
    k = selected.shape[1]
    if effect.rerun_selected is not None:
        w_new, s_new = at(effect.rerun_weights), at(effect.rerun_selected)
    else:
        step = max(1, _CHUNK_ELEMENTS // logits.shape[-1])
        weights, chosen = [], []
        for start in range(0, t_all.numel(), step):
            _, w_new, s_new = layer.family.select_without(layer, logits, t_all[start:start + step],
                                                          j_all[start:start + step])
            weights.append(w_new)
            chosen.append(s_new)
        w_new = torch.cat(weights) if weights else logits.new_zeros(0, k)
        s_new = torch.cat(chosen) if chosen else selected.new_zeros(0, k)
    if entering:
        is_new = ~(s_new.unsqueeze(2) == selected.index_select(0, t_all).unsqueeze(1)).any(dim=2)  # [n, k'] entering
        row, col = is_new.nonzero(as_tuple=True)
    else:
        row = col = t_all[:0]
    num_experts = layer.num_experts
    entering = s_new.reshape(-1).index_select(0, row * s_new.shape[1] + col)
    pair, inverse = torch.unique(t_all.index_select(0, row) * num_experts + entering, return_inverse=True)
    return _Reruns(tokens=t_all, experts=j_all, alias=alias, weights=w_new, selected=s_new, row=row, col=col,
                   pair_token=pair // num_experts, pair_expert=pair % num_experts, inverse=inverse)


def _put(out: torch.Tensor, tokens: torch.Tensor, experts: torch.Tensor, alias: torch.Tensor | None, pairs: slice,
         values: torch.Tensor) -> None:
    """out[tokens, experts] = values, and the same at the pairs' aliases (``alias[pairs]``, -1 none)."""
    out[tokens, experts] = values
    if alias is not None:
        alias = alias[pairs].to(out.device)
        has = alias >= 0
        out[tokens[has], alias[has]] = values[has]


class _Prepared(NamedTuple):
    """What :meth:`LayerAccumulator.prepare` computed for one layer and batch (``selected``: the routing it is for;
    ``swap_index`` [T] / ``pair_index`` [pairs]: the rows of the extra outputs it asked for that hold each token's
    swap expert and each re-run pair's entering expert, None when it asked for none: a (token, expert) row both need
    runs once)."""

    selected: torch.Tensor
    logits: torch.Tensor
    effect: RemovalEffect | None
    reruns: _Reruns | None
    swap_index: torch.Tensor | None = None
    pair_index: torch.Tensor | None = None


class LayerAccumulator:
    """Sums for one MoE layer over ``subsets``; ``criteria`` decides what is computed."""

    def __init__(self, layer: MoELayer, subsets: tuple[str, ...], criteria: tuple[str, ...]):
        self.index, self.num_experts, self.subsets, self.criteria = layer.index, layer.num_experts, subsets, criteria
        device = layer.router_linear.weight.device
        if device.type == "meta":  # a layer loaded only while it runs (lightprune.checkpoints.skeleton): sums on the CPU
            device = torch.device("cpu")
        zeros = lambda: torch.zeros(len(subsets), layer.num_experts, dtype=torch.float64, device=device)  # noqa: E731
        self.sums: dict[str, torch.Tensor] = {name: zeros() for name in _TOKEN_SUMS}
        self.sums["delta_h"] = zeros()
        self.sums["delta_h_promoted"] = zeros()
        self.sums["tokens"] = torch.zeros(len(subsets), dtype=torch.float64, device=device)
        self.sums["samples"] = torch.zeros(len(subsets), dtype=torch.float64, device=device)
        self._pending: _Prepared | None = None

    # ------------------------------------------------------------------ update
    @torch.no_grad()
    def prepare(self, layer: MoELayer, router_input: torch.Tensor, selected: torch.Tensor,
                masks: torch.Tensor, padded: bool | None = None, router_logits: torch.Tensor | None = None,
                routing_state: object = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Before the layer's experts run: the router logits, the family's :class:`RemovalEffect` and the re-run
        selections for the next :meth:`update` of these ``selected`` experts, and the (tokens, experts) rows whose
        outputs it will need beyond the routed ones (for ``delta_h_promoted``: the expert a swap promotes, then the
        experts entering a re-run pair's selection; None: none), so that they run in the forward's own expert call.
        ``padded``: whether the batch has padding (see :meth:`update`). ``router_logits``: the logits the router
        returned for ``router_input`` (``MoEFamily.router_returns_logits``), read instead of recomputed;
        ``routing_state``: what the family's observed router kept in that call, for its removal effect."""
        self._pending = None
        want_dh = "delta_h" in self.criteria or "delta_h_promoted" in self.criteria
        if not (want_dh or "routing_kl" in self.criteria):
            return None
        keep = masks.any(dim=0).unsqueeze(-1)
        padded = _has_padding(keep, padded)
        # padded positions may hold non-finite values: their logits are zeroed (their tokens weigh nothing)
        if router_logits is not None:
            logits = router_logits.reshape(-1, self.num_experts)
            if logits.shape[0] != selected.shape[0]:
                raise RuntimeError(f"layer {self.index}: the router returned logits for {logits.shape[0]} tokens, its "
                                   f"experts got {selected.shape[0]}")
            if padded:  # the routing state stays: it differs only at padded rows (weight 0), and an observed
                # router keeps none for non-finite logits
                logits = torch.where(keep, logits, torch.zeros((), dtype=logits.dtype, device=logits.device))
        else:
            routing_state = None
            if padded:
                router_input = torch.where(keep, router_input, torch.zeros((), dtype=router_input.dtype,
                                                                           device=router_input.device))
            logits = layer.family.router_logits(layer, router_input)
        effect = layer.family.removal_effect(layer, logits, selected, routing_state) if want_dh else None
        reruns = _reselect(layer, logits, selected, effect, "delta_h_promoted" in self.criteria) if want_dh else None
        if "delta_h_promoted" not in self.criteria:
            self._pending = _Prepared(selected, logits, effect, reruns)
            return None
        # every (token, expert) row the promoted variant reads, once: a swap's entering expert is often one that
        # enters a re-run pair's selection of the same token too
        num_experts, device = self.num_experts, selected.device
        keys = [reruns.pair_token.to(device) * num_experts + reruns.pair_expert.to(device)]
        swaps = 0
        if effect.swap_expert is not None:
            swaps = selected.shape[0]
            keys.insert(0, torch.arange(swaps, device=device) * num_experts + effect.swap_expert.to(device))
        rows, index = torch.unique(torch.cat(keys), return_inverse=True)
        self._pending = _Prepared(selected, logits, effect, reruns, index[:swaps] if swaps else None, index[swaps:])
        return rows // num_experts, rows % num_experts

    @torch.no_grad()
    def update(self, layer: MoELayer, hidden: torch.Tensor, selected: torch.Tensor, weights: torch.Tensor,
               outputs: torch.Tensor, masks: torch.Tensor, samples: torch.Tensor, num_samples: int,
               router_input: torch.Tensor | None = None, extra_outputs: torch.Tensor | None = None,
               padded: bool | None = None, router_logits: torch.Tensor | None = None,
               routing_state: object = None) -> None:
        """Add one batch. ``masks`` [n_subsets, T] bool (padding already excluded), ``samples`` [T]
        the sample index of each token; ``router_input`` [T, H] what the router saw (default: ``hidden``, the
        experts' input), from which routing-KL and Delta-H recompute the router's logits. After :meth:`prepare`
        for the same ``selected``, ``extra_outputs`` are the outputs of the rows it asked for; without it, it is
        called here (and the rows it would ask for are run here). ``padded``: whether the batch has padding (its
        observer knows it once per batch; None: derived here from ``masks``, one host sync). ``router_logits``,
        ``routing_state``: as for :meth:`prepare`, when it runs here."""
        prepared, self._pending = self._pending, None
        if prepared is None or prepared.selected is not selected:
            extra_outputs = None
            self.prepare(layer, hidden if router_input is None else router_input, selected, masks, padded,
                         router_logits, routing_state)
            prepared, self._pending = self._pending, None
        num_experts = self.num_experts
        # Tokens in no subset are masked by multiplication below, and 0 * NaN = NaN: the model may leave
        # non-finite values at padded positions, so a batch with padding zeroes them first (real tokens outside
        # the subsets are finite: their zero weight is enough).
        keep = masks.any(dim=0)                                          # [T]
        padded = _has_padding(keep, padded)
        if padded:
            zero = lambda t: torch.zeros((), dtype=t.dtype, device=t.device)  # noqa: E731
            hidden = torch.where(keep.unsqueeze(-1), hidden, zero(hidden))
            weights = torch.where(keep.unsqueeze(-1), weights, zero(weights))
            outputs = torch.where(keep.view(-1, 1, 1), outputs, zero(outputs))
        dtype = _compute_dtype(outputs)
        m = masks.to(dtype)                                              # [U, T]
        w = weights.to(dtype) * layer.family.output_scale(layer)  # the weight each output gets in the block
        f = outputs.to(dtype)
        gram = torch.bmm(f, f.transpose(1, 2))                           # [T, k, k]: f_s . f_r
        norms = gram.diagonal(dim1=1, dim2=2).clamp_min(0).sqrt()        # ||f_s||  [T, k]
        per_slot = torch.stack([torch.ones_like(w), w, norms, w * norms], dim=1)   # [T, 4, k]
        # each subset's token-weighted slot values, added at their experts: [U, 4, T k] -> [U, 4, E]
        weighted = (m.view(m.shape[0], -1, 1, 1) * per_slot).transpose(1, 2).flatten(2)
        token_sums = torch.zeros(m.shape[0], 4, num_experts, dtype=dtype, device=hidden.device).scatter_add_(
            2, selected.reshape(1, 1, -1).expand(m.shape[0], 4, -1), weighted)
        for c, name in enumerate(("frequency", "seer", "ean", "reap_num")):
            self.sums[name] += token_sums[:, c].double()
        self.sums["tokens"] += m.sum(dim=1).double()
        counts = torch.zeros(len(self.subsets), num_samples, dtype=dtype, device=hidden.device)
        counts.index_add_(1, samples, m)                                 # [U, B] subset tokens per sample
        self.sums["samples"] += (counts > 0).sum(dim=1).double()
        if prepared is None:  # no routing-KL and no Delta-H asked for
            return
        want_dh = "delta_h" in self.criteria
        want_promoted = "delta_h_promoted" in self.criteria
        logits, effect, reruns = prepared.logits, prepared.effect, prepared.reruns
        if "routing_kl" in self.criteria:
            self.sums["routing_kl"] += (m @ routing_kl(router_distribution(layer, logits)).to(dtype)).double()
        if want_dh or want_promoted:
            weight = m / counts.clamp_min(1)[:, samples]                  # [U, T]: the mean over a sample's tokens
            swap_outputs = rerun_outputs = None
            if extra_outputs is not None:  # a padded token's expert output may be NaN, and 0 * NaN = NaN
                extra_outputs = extra_outputs.to(dtype)
                index = prepared.swap_index
                swap_outputs = None if index is None else extra_outputs.index_select(0, index.to(extra_outputs.device))
                rerun_outputs = extra_outputs.index_select(0, prepared.pair_index.to(extra_outputs.device))
                if padded:
                    if swap_outputs is not None:
                        swap_outputs = torch.where(keep.unsqueeze(-1), swap_outputs, 0.0)
                    rerun_outputs = torch.where(keep[reruns.pair_token.to(keep.device)].unsqueeze(-1), rerun_outputs,
                                                0.0)
            dh, dhp = self._delta_h(layer, hidden, logits, selected, w, f, gram, want_promoted, effect, reruns,
                                    swap_outputs, rerun_outputs)
            if want_dh:
                self.sums["delta_h"] += (weight @ dh).double()
            if want_promoted:
                self.sums["delta_h_promoted"] += (weight @ dhp).double()

    def _delta_h(self, layer: MoELayer, hidden: torch.Tensor, logits: torch.Tensor, selected: torch.Tensor,
                 w: torch.Tensor, f: torch.Tensor, gram: torch.Tensor, promoted: bool, effect: RemovalEffect,
                 reruns: _Reruns, swap_outputs: torch.Tensor | None = None,
                 rerun_outputs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """dh [T, E] in ``w``'s dtype (and the promoted variant), from the family's :class:`RemovalEffect`.

        Any removal with weights scaled by 1 + g: H^(-j) = (1 + g) H, dh = g^2 ||H||^2 with ||H||^2 = w^T G w. A
        swap of selected slot r: D = (w_s (-factor) for s != r, w_r), dh = D^T G D, batched over [T, k]. A re-run
        (token, expert) pair: the family's selection with the expert masked, a chunk of pairs per call (one mask per
        row). Later kinds overwrite earlier ones (growth, then swaps, then re-runs). The promoted variant of a swap
        expands the square, so the entering expert runs once per token (``swap_outputs`` [T, H] when the forward ran
        it) and no [T, k, H] tensor is formed.
        """
        num_tokens, num_experts = logits.shape
        dtype, device = w.dtype, hidden.device
        if effect.growth is None:
            dh = torch.zeros(num_tokens, num_experts, dtype=dtype, device=device)
        else:
            norm2 = torch.einsum("ts,tsr,tr->t", w, gram, w)             # ||H_t||^2
            dh = effect.growth.to(device=device, dtype=dtype).pow(2) * norm2.unsqueeze(-1)
        dhp = dh.clone() if promoted else None
        output_scale = layer.family.output_scale(layer)
        k, width = selected.shape[1], f.shape[-1]
        if effect.swap_factor is not None:
            factor = effect.swap_factor.to(device=device, dtype=dtype)
            eye = torch.eye(k, dtype=torch.bool, device=device)
            diff = torch.where(eye, w.unsqueeze(1), -w.unsqueeze(1) * factor.unsqueeze(-1))   # D [T, r, s]
            ids = selected.to(device)
            quad = ((diff @ gram) * diff).sum(dim=-1)                       # D^T G D  [T, k]
            dh.scatter_(1, ids, quad)
            if dhp is not None:
                # ||sum_s D_s f_s - w' f_n||^2 = D^T G D - 2 w' D . (f_s . f_n) + w'^2 ||f_n||^2: f_n once per token
                tokens = torch.arange(num_tokens, device=device)
                f_n = swap_outputs if swap_outputs is not None else \
                    expert_rows(layer.experts, hidden, tokens, effect.swap_expert.to(device)).to(dtype)
                cross = torch.bmm(f, f_n.unsqueeze(-1)).squeeze(-1)         # f_s . f_n  [T, k]
                weight = effect.swap_weight.to(device=device, dtype=dtype) * output_scale
                value = quad - 2 * weight * (diff @ cross.unsqueeze(-1)).squeeze(-1) \
                    + weight.pow(2) * f_n.pow(2).sum(dim=-1, keepdim=True)
                dhp.scatter_(1, ids, value.clamp_min(0))
        if promoted and reruns.pair_token.numel() and rerun_outputs is None:
            rerun_outputs = expert_rows(layer.experts, hidden, reruns.pair_token.to(device),
                                        reruns.pair_expert.to(device)).to(dtype)
        tokens = reruns.tokens.to(device)
        if not tokens.numel():
            return dh, dhp
        slots = 0
        if promoted and reruns.pair_token.numel():
            # the distinct entering outputs of each token, densely [T, slots, H]: their dot products with the token's
            # selected outputs and with each other are batched per token (no [pairs, k, H] gather)
            pair_token = reruns.pair_token.to(device)
            per_token = torch.bincount(pair_token, minlength=num_tokens)
            rank = torch.arange(pair_token.numel(), device=device) - (per_token.cumsum(0) - per_token)[pair_token]
            slots = int(per_token.max())
        step = max(1, _CHUNK_ELEMENTS // (max(k, slots) * (width if slots else k)))   # tokens per chunk
        for t0 in range(0, num_tokens, step):
            t1 = min(num_tokens, t0 + step)
            first, last = torch.searchsorted(tokens, torch.tensor([t0, t1], device=device)).tolist()
            if first == last:
                continue
            pairs = slice(first, last)
            t, j = tokens[pairs], reruns.experts[pairs].to(device)
            w_new = reruns.weights[pairs].to(device=device, dtype=dtype) * output_scale       # [n, k']
            match = reruns.selected[pairs].to(device).unsqueeze(2) == selected.index_select(0, t).unsqueeze(1)
            diff = w.index_select(0, t) - torch.einsum("np,nps->ns", w_new, match.to(dtype))   # D [n, k]
            quad = torch.einsum("ns,nsr,nr->n", diff, gram.index_select(0, t), diff)           # D^T G D
            _put(dh, t, j, reruns.alias, pairs, quad)
            if dhp is None:
                continue
            # ||sum_s D_s f_s - sum_p a_p f_p||^2 = D^T G D - 2 D^T C a + a^T P a, with the entering outputs f_p,
            # their weights a, C = f_s . f_p and P = f_p . f_q
            e0, e1 = torch.searchsorted(reruns.row, torch.tensor([first, last], device=reruns.row.device)).tolist()
            value = quad
            if e1 > e0:
                row, col = reruns.row[e0:e1].to(device) - first, reruns.col[e0:e1].to(device)
                pair = reruns.inverse[e0:e1].to(device)
                a = torch.zeros(last - first, slots, dtype=dtype, device=device)
                a[row, rank[pair]] = w_new[row, col]
                p0, p1 = torch.searchsorted(pair_token, torch.tensor([t0, t1], device=device)).tolist()
                outputs = torch.zeros(t1 - t0, slots, width, dtype=dtype, device=device)
                outputs[pair_token[p0:p1] - t0, rank[p0:p1]] = rerun_outputs[p0:p1]
                cross = torch.bmm(f[t0:t1], outputs.transpose(1, 2)).index_select(0, t - t0)  # C [n, k, slots]
                among = torch.bmm(outputs, outputs.transpose(1, 2)).index_select(0, t - t0)   # P [n, slots, slots]
                value = quad - 2 * torch.einsum("ns,nsm,nm->n", diff, cross, a) \
                    + torch.einsum("nm,nmq,nq->n", a, among, a)
            _put(dhp, t, j, reruns.alias, pairs, value.clamp_min(0))
        return dh, dhp

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



"""Text-to-vision attention scores per vision token, read in the model's own forward (MAEP ("Modality-Aware Expert
Pruning for MoE-Based Multimodal Large Language Models", arXiv 2611.05927), sections 4.2 and 5.2).

MAEP section 4.2 / 5.2: "the attention score of a vision token [is] the average text-to-vision attention
weight, averaged across all heads at each layer (a single scalar per token, layer, and sample)"; the
bottom q = 2% per sample and layer are the low-attention vision tokens. As computed here:

    score(b, l, v) = mean over heads h and over text queries q that may attend to v of A_l[b, h, q, v]

where A_l is layer l's softmax attention (normalised over every key the query attends to, mask
included), text = neither a vision token nor padding; NaN where no text query attends to v.

Mechanism: no eager switch, no hooks. A wrapper attention function is registered in transformers'
``AttentionInterface`` under ``"lightprune_probe:<original>"`` (and the original's mask builder in
``AttentionMaskInterface`` under the same name), and the language model's config is switched to that
name inside the `AttentionProbe` context. The wrapper returns the original implementation's
output unchanged and, for probed layers only, recomputes the probabilities of the text-query rows
against all keys (q k^T * scaling, softcap, mask, sinks, log-sum-exp) in fp32, in row chunks. The
vision tower keeps its own implementation; names are registered on entry and removed on exit
(the registration helpers are shared with MWOP's path attention: `attention_interface`).
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from typing import Any, Callable

import torch
from torch import nn

from lightprune.core.checks import ratio_count
from lightprune.models import get_family
from lightprune.observe.attention_interface import (
    dense_mask,
    language_model_configs,
    original_function,
    register_wrapper,
    restore_attention,
    switch_attention,
    wrappable,
)

__all__ = ["AttentionProbe", "low_high_masks", "modality_masks", "PROBE_PREFIX"]

PROBE_PREFIX = "lightprune_probe:"
#: elements of one fp32 [B, H, rows, K] chunk of probabilities (64 MiB)
_CHUNK_ELEMENTS = 1 << 24

#: an attention forward that picks what it computes by the implementation's name (``_attn_implementation in
#: ("eager", "sdpa")``, ``== "sdpa"``); the usual ``!= "eager"`` dispatch to the registered function is not one
_NAME_GATE = re.compile(r"_attn_implementation\s+(?:not\s+)?in\s*[(\[{]|_attn_implementation\s*[!=]=\s*[\"']sdpa")


@functools.lru_cache(maxsize=None)
def gates_on_implementation_name(cls: type) -> bool:
    """Whether ``cls.forward`` changes what it computes with the attention implementation's name (an indexed sparse
    attention that builds its indexer's mask only under "eager" / "sdpa"): under the probe's renamed implementation
    such a layer would compute something else, so the probe refuses it."""
    try:
        return _NAME_GATE.search(inspect.getsource(cls.forward)) is not None
    except (OSError, TypeError):  # no source to read: a compiled or dynamically built class
        return False


_PROBED: dict[int, tuple["AttentionProbe", int]] = {}  # id(attention module) -> (probe, layer index)


def _make_attention(original: str) -> Callable:
    def probe_attention(module, query, key, value, attention_mask, **kwargs):
        output = original_function(original, module)(module, query, key, value, attention_mask, **kwargs)
        entry = _PROBED.get(id(module))
        if entry is not None:
            probe, layer = entry
            probe._record(layer, module, query, key, attention_mask, kwargs)
        return output

    probe_attention.__name__ = f"probe_attention[{original}]"
    return probe_attention


def _register(original: str) -> str:
    if original.startswith(PROBE_PREFIX):
        raise RuntimeError("an AttentionProbe is already active on this model")
    allowed = wrappable((PROBE_PREFIX,))
    if original not in allowed:
        raise ValueError(f"AttentionProbe cannot wrap attention implementation {original!r}; use one of {allowed}")
    return register_wrapper(PROBE_PREFIX, original, _make_attention)


def modality_masks(input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                   vision_token_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """``(text_mask, vision_mask)`` [B, S] bool: vision = a placeholder id, text = the other non-padding."""
    valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    ids = torch.as_tensor(list(vision_token_ids), dtype=input_ids.dtype, device=input_ids.device)
    vision = torch.isin(input_ids, ids) & valid
    return valid & ~vision, vision


def low_high_masks(scores: torch.Tensor, vision_mask: torch.Tensor,
                   q: float = 0.02) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample, the bottom / top ``q`` fraction of its vision tokens by ``scores`` [B, S].

    k = ceil(q * n) and at least 1, n = the sample's vision tokens with a finite score (a NaN score, a
    token no text query attends to, is in neither set); ties go to the earlier position; a sample with
    no scored vision token has both masks all False.
    """
    if not 0.0 < q <= 1.0:
        raise ValueError(f"q must be in (0, 1], got {q}")
    if scores.shape != vision_mask.shape or scores.dim() != 2:
        raise ValueError(f"scores {tuple(scores.shape)} and vision_mask {tuple(vision_mask.shape)} must both be [B, S]")
    valid = vision_mask.bool() & torch.isfinite(scores)
    n = valid.sum(dim=1)
    # exact: q as written (0.07 of 100 is 7, where 0.07 * 100 == 7.000000000000001 would round up to 8)
    k = torch.tensor([max(1, ratio_count(q, c, math.ceil)) if c else 0 for c in n.tolist()], device=scores.device)
    masks = []
    for key in (scores, -scores):
        key = torch.where(valid, key.float(), torch.full_like(key, float("inf"), dtype=torch.float32))
        order = torch.sort(key, dim=1, stable=True).indices
        rank = torch.empty_like(order).scatter_(1, order, torch.arange(key.shape[1], device=key.device).expand_as(order))
        masks.append(valid & (rank < k[:, None]))
    return masks[0], masks[1]


class AttentionProbe:
    """Context manager: text-to-vision attention scores of ``layers`` in the model's normal forward.

    ``layers`` are decoder layer indices (default: the MoE layers). Before each forward call
    `set_batch`; after it `pop_scores` gives ``{layer: Tensor[B, S]}`` (fp32, NaN where the
    position is not a vision token or no text query attends to it); `layer_scores` reads one layer
    during the forward, once that layer's attention ran. Nothing accumulates across batches.
    Only a full (prefill) forward is supported: queries and keys must span the batch's S positions.
    """

    def __init__(self, model: nn.Module, layers: list[int] | None = None):
        family = get_family(model)
        path, decoder = family.decoder_layers()
        if layers is None:
            layers = [layer.index for layer in family.layers()]
        layers = sorted({int(i) for i in layers})
        bad = [i for i in layers if not 0 <= i < len(decoder)]
        if bad:
            raise ValueError(f"layers {bad} out of range: the model has {len(decoder)} decoder layers")
        self.model = model
        self.layers = layers
        self._attention: dict[int, nn.Module] = {}
        for i in layers:
            attn = getattr(decoder[i], "self_attn", None)
            if attn is None or getattr(attn, "config", None) is None:
                types = getattr(family.text_config, "layer_types", None) or []
                kind = f" (a {types[i]!r} layer)" if i < len(types) else ""
                raise ValueError(f"decoder layer {i}{kind} has no softmax self-attention (self_attn) to rank vision "
                                 "tokens by; the attention subsets (vision_low_attn, vision_high_attn) need one in "
                                 "every probed layer: use 'vision' / 'text' subsets on this model")
            if getattr(attn, "layer_idx", i) != i:
                raise ValueError(f"decoder layer {i}: self_attn.layer_idx is {attn.layer_idx}")
            self._attention[i] = attn
        gated = sorted({type(layer.self_attn).__name__ for layer in decoder if hasattr(layer, "self_attn")
                        and gates_on_implementation_name(type(layer.self_attn))})
        if gated:
            raise ValueError(f"{', '.join(gated)} builds its attention mask from the implementation's name (an indexed "
                             "sparse attention applies its indexer's selection only under 'eager' / 'sdpa'): under the "
                             "attention probe the model would attend to other keys, so the attention subsets "
                             "(vision_low_attn, vision_high_attn) are not available for this model; use 'vision' / "
                             "'text' subsets")
        # every config the language model's attention and mask builders read
        parent = model.get_submodule(path.rsplit(".", 1)[0]) if "." in path else model
        self._configs = language_model_configs(decoder, parent)
        self._saved: list[tuple[Any, Any, str]] = []
        self._text: torch.Tensor | None = None
        self._vision: torch.Tensor | None = None
        self._scores: dict[int, torch.Tensor] = {}
        self.active = False

    # ------------------------------------------------------------------ context
    def __enter__(self) -> "AttentionProbe":
        if self.active:
            raise RuntimeError("this AttentionProbe is already active")
        try:
            self._saved = switch_attention(self._configs, _register)
            for i, attn in self._attention.items():
                _PROBED[id(attn)] = (self, i)
        except BaseException:
            self._restore()
            raise
        self.active = True
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def _restore(self) -> None:
        for i, attn in self._attention.items():
            if _PROBED.get(id(attn), (None,))[0] is self:
                del _PROBED[id(attn)]
        restore_attention(self._saved)
        self._text = self._vision = None
        self.active = False

    # ------------------------------------------------------------------ batch and results
    def set_batch(self, text_mask: torch.Tensor, vision_mask: torch.Tensor) -> None:
        """Token roles [B, S] of the next forward (both without padding; disjoint)."""
        if text_mask.shape != vision_mask.shape or text_mask.dim() != 2:
            raise ValueError(f"text_mask {tuple(text_mask.shape)} and vision_mask {tuple(vision_mask.shape)} "
                             f"must both be [B, S]")
        text_mask, vision_mask = text_mask.bool(), vision_mask.bool()
        if (text_mask & vision_mask).any():
            raise ValueError("a position is marked both text and vision")
        self._text, self._vision = text_mask, vision_mask
        self._scores = {}

    def layer_scores(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s scores [B, S] of the current forward, readable as soon as its attention ran
        (e.g. from that layer's MoE block in the same forward); nothing is cleared."""
        if layer not in self._scores:
            raise RuntimeError(f"no scores for layer {layer} yet: probed layers {self.layers}; the layer's "
                               f"attention must run after set_batch")
        return self._scores[layer]

    def pop_scores(self) -> dict[int, torch.Tensor]:
        """``{layer: Tensor[B, S]}`` of the last forward; clears the batch and the scores."""
        missing = [i for i in self.layers if i not in self._scores]
        if missing:
            raise RuntimeError(f"no scores for layers {missing}: run a forward inside the probe after set_batch")
        scores, self._scores = self._scores, {}
        self._text = self._vision = None
        return scores

    # ------------------------------------------------------------------ the score
    def _record(self, layer: int, module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                attention_mask: Any, kwargs: dict) -> None:
        if self._text is None:
            raise RuntimeError("AttentionProbe: call set_batch(text_mask, vision_mask) before each forward")
        batch, heads, q_len, dim = query.shape
        k_len = key.shape[2]
        if (batch, q_len) != tuple(self._text.shape) or k_len != q_len:
            raise ValueError(f"AttentionProbe layer {layer}: query {tuple(query.shape)} / key {tuple(key.shape)} "
                             f"do not span the batch {tuple(self._text.shape)}; only full forwards are probed")
        with torch.no_grad():
            self._scores[layer] = _text_to_vision(module, query, key, attention_mask, kwargs,
                                                  self._text.to(query.device), self._vision.to(query.device))


def _text_to_vision(module: nn.Module, query: torch.Tensor, key: torch.Tensor, attention_mask: Any,
                    kwargs: dict, text: torch.Tensor, vision: torch.Tensor) -> torch.Tensor:
    batch, heads, q_len, dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    device = query.device
    scores = torch.full((batch, k_len), float("nan"), dtype=torch.float32, device=device)
    if not vision.any() or not text.any():
        return scores
    groups = heads // kv_heads
    scaling = kwargs.get("scaling")
    scaling = dim ** -0.5 if scaling is None else scaling
    softcap = kwargs.get("softcap")
    sinks = kwargs.get("s_aux")
    allowed, additive = dense_mask(module, attention_mask, batch, q_len, k_len, device, kwargs)
    mask_heads = allowed.shape[1]
    allowed = allowed.expand(batch, -1, -1, -1)
    if additive is not None:
        additive = additive.expand(batch, -1, -1, -1)

    # per sample, its text rows first (ascending), padded to the longest
    n_text = text.sum(dim=1)
    rows = torch.sort((~text).to(torch.int8), dim=1, stable=True).indices[:, : int(n_text.max())]
    row_valid = torch.arange(rows.shape[1], device=device)[None, :] < n_text[:, None]
    keys = key.float()[:, :, None].transpose(-1, -2)  # [B, Hkv, 1, D, K]
    total = torch.zeros(batch, k_len, dtype=torch.float32, device=device)
    count = torch.zeros(batch, k_len, dtype=torch.float32, device=device)
    step = max(1, _CHUNK_ELEMENTS // max(1, batch * heads * k_len))
    for start in range(0, rows.shape[1], step):
        idx, valid = rows[:, start:start + step], row_valid[:, start:start + step]
        c = idx.shape[1]
        q = query.gather(2, idx[:, None, :, None].expand(batch, heads, c, dim)).float()
        logits = (q.view(batch, kv_heads, groups, c, dim) @ keys).view(batch, heads, c, k_len) * scaling
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        gather = idx[:, None, :, None].expand(batch, mask_heads, c, k_len)
        ok = allowed.gather(2, gather)
        if additive is not None:
            logits = logits + additive.gather(2, gather)
        logits = logits.masked_fill(~ok, float("-inf"))
        if sinks is not None:
            sink = sinks.float().reshape(1, heads, 1, 1).expand(batch, heads, c, 1)
            lse = torch.logsumexp(torch.cat([logits, sink], dim=-1), dim=-1, keepdim=True)
        else:
            lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        probs = torch.exp(logits - lse)
        counted = ok & valid[:, None, :, None]
        probs = torch.where(counted, probs, 0.0)
        total += probs.sum(dim=(1, 2))
        count += counted.sum(dim=(1, 2)).float() * (heads // mask_heads)
    return torch.where(vision & (count > 0), total / count.clamp_min(1.0), scores)

"""Theoretical decoder prefill FLOPs of a dense or width-pruned MLLM (MWOP ("MWOP: Modality-aware Width-wise
Operation Pruning for Efficient MLLMs"), appendix D.4).

Two FLOPs per multiply-accumulate; system tokens excluded; the counted sequence is ``V`` visual tokens
followed by ``T`` text tokens (``N = V + T``), as in the paper's input profiles. Per decoder layer l:

    F_attn,l = 4 N d_q_in (d_q + d_kv) + 4 d_q a_l
        the four projections (q and o are d x d_q, k and v are d x d_kv) and the QK^T and AV products;
        a_l = (1/H) sum_h sum_i |A_l,h(i)| = retained causal (query, key) pairs per head, averaged over heads.
        Dense: a_l = N (N + 1) / 2. With a WidthPlan, head h of layer l keeps
            V (V + 1) / 2 pairs if its V2V path is kept, T V if T2V is kept, T (T + 1) / 2 if T2T is kept.
    F_ffn,l  = 6 d (V m~_V,l + T m~_T,l),   m~_mu,l = min(m, b ceil(k_mu,l / b))
        gate, up and down projections; k_mu,l the retained channels of modality mu, b the alignment
        (the paper's b = 64; text keeps the full width m in its configurations).
    F_total  = sum_l (F_attn,l + F_ffn,l) + 2 d U      (last-token LM head, U the vocabulary size)

The paper writes d for both the hidden width and the query width (equal in its 7B models); here d is the
hidden width and d_q = heads x head_dim, which reduces to the paper's formula when they are equal. Paper
check: LLaVA-OneVision-7B at (V, T) = (3215, 19) gives 44.31 TFLOPs, Qwen2.5-VL-7B at (485, 38) 6.88.

MoE layers (Qwen3-VL-MoE: attention paths only) count the routed compute every token runs,
``6 d top_k m_e`` per token plus ``2 d E`` for the router and ``6 d m_s`` for a shared expert; this goes beyond
the paper, which counts dense FFNs only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from lightprune.core.checks import check_positive_int, integer

__all__ = ["FlopCount", "decoder_flops"]

_PATHS = ("v2v", "t2v", "t2t")


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of one prefill; ``fraction`` is ``total / dense_total`` (1.0 for the dense model)."""

    attention: float
    ffn: float
    lm_head: float
    dense_attention: float
    dense_ffn: float
    per_layer: list[dict[str, float]] = field(default_factory=list)

    @property
    def total(self) -> float:
        return self.attention + self.ffn + self.lm_head

    @property
    def dense_total(self) -> float:
        return self.dense_attention + self.dense_ffn + self.lm_head

    @property
    def fraction(self) -> float:
        return self.total / self.dense_total

    @property
    def attention_fraction(self) -> float:
        return self.attention / self.dense_attention

    @property
    def ffn_fraction(self) -> float:
        return self.ffn / self.dense_ffn

    def as_dict(self) -> dict[str, Any]:
        return {"attention": self.attention, "ffn": self.ffn, "lm_head": self.lm_head, "total": self.total,
                "dense_total": self.dense_total, "fraction": self.fraction,
                "attention_fraction": self.attention_fraction, "ffn_fraction": self.ffn_fraction,
                "per_layer": self.per_layer}


def _text_config(config):
    text = getattr(config, "text_config", None)
    return text if text is not None else config


def _get(cfg, *names, default=None):
    for name in names:
        value = getattr(cfg, name, None)
        if value is not None:
            return value
    if default is not None:
        return default
    raise ValueError(f"config {type(cfg).__name__} has none of {list(names)}; cannot count FLOPs")


def _moe_layers(cfg) -> set[int]:
    """Decoder layers whose FFN is a mixture of experts, by the config's own switches."""
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None) or \
        getattr(cfg, "n_routed_experts", None)
    if not experts:
        return set()
    layers = int(cfg.num_hidden_layers)
    dense_first = int(getattr(cfg, "first_k_dense_replace", 0) or 0)
    step = int(getattr(cfg, "decoder_sparse_step", 1) or 1)
    only_mlp = set(getattr(cfg, "mlp_only_layers", None) or [])
    return {l for l in range(layers) if l >= dense_first and l not in only_mlp and (l + 1) % step == 0}


def _aligned(kept: int, width: int, align: int) -> int:
    return min(width, align * math.ceil(kept / align))


def _pair_counts(vision: int, text: int) -> dict[str, int]:
    return {"v2v": vision * (vision + 1) // 2, "t2v": text * vision, "t2t": text * (text + 1) // 2}


def decoder_flops(config, vision_tokens: int, text_tokens: int, plan=None, align: int = 64) -> FlopCount:
    """Prefill FLOPs of the language decoder of ``config`` for ``vision_tokens`` + ``text_tokens``.

    Args:
        config: a transformers config (an MLLM's outer config or its text config).
        vision_tokens: the input profile's vision tokens V, system tokens excluded.
        text_tokens: its text tokens T.
        plan: a [`WidthPlan`][...WidthPlan] (its ``attn_keep`` [H, 3] masks and its ``ffn_keep``
            channel masks); None counts the dense model.
        align: the compact FFN's channel alignment b (1 = no padding).
    """
    given = (vision_tokens, text_tokens)
    vision_tokens, text_tokens = integer(vision_tokens), integer(text_tokens)  # NumPy ints too; NaN, bools refused
    if vision_tokens is None or text_tokens is None or vision_tokens < 0 or text_tokens < 0:
        raise ValueError(f"vision_tokens and text_tokens must be integers >= 0, got {given[0]}, {given[1]}")
    if vision_tokens + text_tokens == 0:
        raise ValueError("vision_tokens + text_tokens must be > 0")
    align = check_positive_int("align", align)
    cfg = _text_config(config)
    d = int(_get(cfg, "hidden_size"))
    heads = int(_get(cfg, "num_attention_heads"))
    head_dim = int(_get(cfg, "head_dim", default=d // heads))
    kv_heads = int(_get(cfg, "num_key_value_heads", default=heads))
    layers = int(_get(cfg, "num_hidden_layers"))
    vocab = int(_get(cfg, "vocab_size"))
    d_q, d_kv = heads * head_dim, kv_heads * head_dim
    V, T = int(vision_tokens), int(text_tokens)
    N = V + T
    pairs = _pair_counts(V, T)
    moe = _moe_layers(cfg)
    attn_keep = {} if plan is None else dict(plan.attn_keep)
    ffn_keep = {} if plan is None else dict(plan.ffn_keep)
    bad = sorted(l for l in (*attn_keep, *ffn_keep) if not 0 <= int(l) < layers)
    if bad:
        raise ValueError(f"plan names layers {bad} but the config has {layers} decoder layers")

    per_layer: list[dict[str, float]] = []
    totals = {"attention": 0.0, "ffn": 0.0, "dense_attention": 0.0, "dense_ffn": 0.0}
    for l in range(layers):
        projections = 2.0 * N * (2 * d * d_q + 2 * d * d_kv)  # q, o: d x d_q; k, v: d x d_kv; 2 FLOPs per MAC
        dense_pairs = N * (N + 1) / 2
        if l in attn_keep:
            keep = attn_keep[l]
            if tuple(keep.shape) != (heads, len(_PATHS)):
                raise ValueError(f"plan layer {l} attention mask has shape {tuple(keep.shape)}, "
                                 f"the config has {heads} heads x {len(_PATHS)} paths")
            kept = keep.double().sum(0).tolist()  # heads keeping each path
            a = sum(kept[i] * pairs[p] for i, p in enumerate(_PATHS)) / heads
        else:
            a = dense_pairs
        attention = projections + 4.0 * d_q * a
        dense_attention = projections + 4.0 * d_q * dense_pairs
        if l in moe:
            if l in ffn_keep:
                raise ValueError(f"plan prunes FFN channels of layer {l}, whose FFN is a mixture of experts")
            experts = int(_get(cfg, "num_experts", "num_local_experts", "n_routed_experts"))
            top_k = int(_get(cfg, "num_experts_per_tok"))
            m_e = int(_get(cfg, "moe_intermediate_size", "intermediate_size"))
            shared = int(getattr(cfg, "shared_expert_intermediate_size", 0) or 0)
            ffn = dense_ffn = 2.0 * N * (d * experts + 3 * d * (top_k * m_e + shared))
        else:
            m = int(_get(cfg, "intermediate_size"))
            widths = {"vision": m, "text": m}
            for modality, mask in ffn_keep.get(l, {}).items():
                if mask.numel() != m:
                    raise ValueError(f"plan layer {l} {modality} FFN mask has {mask.numel()} channels, "
                                     f"the config has {m}")
                widths[modality] = _aligned(int(mask.sum()), m, int(align))
            ffn = 6.0 * d * (V * widths["vision"] + T * widths["text"])
            dense_ffn = 6.0 * d * N * m
        per_layer.append({"attention": attention, "ffn": ffn, "pairs_per_head": a})
        totals["attention"] += attention
        totals["ffn"] += ffn
        totals["dense_attention"] += dense_attention
        totals["dense_ffn"] += dense_ffn
    return FlopCount(attention=totals["attention"], ffn=totals["ffn"], lm_head=2.0 * d * vocab,
                     dense_attention=totals["dense_attention"], dense_ffn=totals["dense_ffn"], per_layer=per_layer)

"""Multi-token-prediction (MTP) layers: decoder layers a checkpoint holds beyond the ones its model class builds.

DeepSeek-V3 ("DeepSeek-V3 Technical Report", arXiv 2412.19437, section 2.2) stores its MTP module as
``model.layers.{num_hidden_layers}``: a whole decoder layer (attention and an MoE block with the model's router and
experts) plus ``enorm``, ``hnorm``, ``eh_proj`` and a ``shared_head``; GLM-4.5 stores its own the same way
(``num_nextn_predict_layers`` of them); Qwen3-Next and Qwen3.5 store theirs as ``mtp.layers.{i}`` (a decoder layer with
the model's MoE block) beside ``mtp.fc`` and its norms (``mtp_num_hidden_layers`` of them), which lightprune reads as
decoder layer ``num_hidden_layers + i``. transformers' classes build ``num_hidden_layers`` layers and skip these keys
when they load, so a checkpoint pruned without them would keep every expert of the MTP layer while its config says
fewer: what a serving stack's speculative decoding then reads.

The out-of-core paths that write or score a checkpoint ([`Skeleton`][..skeleton.Skeleton] with
``mtp=True``) build the model with the MTP layers as further decoder layers (`config_with_mtp`): each one's
MoE block is then an MoE layer like any other, named by its layer number (61 in DeepSeek-V3), scored from its
weights, pruned by the plan, verified against the masked source; its MTP-only tensors are copied unchanged.
"""

from __future__ import annotations

import copy
import re
from typing import Any

__all__ = ["config_with_mtp", "config_without_mtp", "mtp_alias", "mtp_layers", "mtp_prefixes", "undeclared_mtp"]

_DECODER_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
#: Qwen3-Next's and Qwen3.5's MTP decoder layers
_MTP_MODULE = re.compile(r"^mtp\.layers\.(\d+)\.")
#: the config keys that count MTP layers
_DECLARED = ("num_nextn_predict_layers", "mtp_num_hidden_layers")


def _declared(config: Any) -> int | None:
    for name in _DECLARED:
        found = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
        if isinstance(found, int) and not isinstance(found, bool):
            return found
    return None


def mtp_alias(key: str, count: int) -> str:
    """``key`` as a decoder layer's: ``mtp.layers.{i}.X`` is ``model.layers.{count + i}.X`` (``count``: the model's
    ``num_hidden_layers``); any other key as it is."""
    found = _MTP_MODULE.match(key)
    return key if found is None else f"model.layers.{count + int(found.group(1))}.{key[found.end():]}"


def mtp_prefixes(layers: list[int], count: int) -> tuple[str, ...]:
    """The key prefixes of the MTP layers ``layers`` (decoder-layer numbers from ``count``): ``model.layers.{n}.``, and
    ``mtp.`` (Qwen3-Next's module: its layers, ``fc`` and norms); empty without MTP layers."""
    return (*(f"model.layers.{n}." for n in layers), "mtp.") if layers else ()


def mtp_layers(path: Any, config: Any, keys: list[str]) -> list[int]:
    """The layer numbers of the checkpoint ``keys`` (``model.layers.<n>.``, and ``mtp.layers.<i>.`` as layer
    ``num_hidden_layers + i``) at or past ``config.num_hidden_layers``, ascending: its MTP layers (see the module
    docstring); empty for a model without them. Starting at ``num_hidden_layers``, they must follow the model's layers
    without a gap, at most ``num_nextn_predict_layers`` (or ``mtp_num_hidden_layers``) of them (``ValueError`` naming
    the layers); a config that declares no MTP layers has none, nor one whose further layers start later (both copied
    as they are)."""
    count = getattr(config, "num_hidden_layers", None)
    if not isinstance(count, int) or isinstance(count, bool):
        return []
    declared = _declared(config)
    found = sorted({int(m.group(1)) for key in keys for m in [_DECODER_LAYER.match(mtp_alias(key, count))] if m}
                   - set(range(count)))
    if not found or not isinstance(declared, int) or isinstance(declared, bool) or declared < 1 or found[0] != count:
        return []  # none, or layers transformers' own patterns ignore (DeepSeek-V3's 61 of a shallower config)
    if found != list(range(count, count + len(found))) or len(found) > declared:
        raise ValueError(f"checkpoint {str(path)!r} holds decoder layers {found} past its config's "
                         f"num_hidden_layers {count}, which are not {declared} multi-token-prediction layer(s) "
                         f"following the model's ({' / '.join(_DECLARED)} {declared}): a config for another "
                         "checkpoint; restore it")
    return found


def config_with_mtp(config: Any, layers: list[int]) -> Any:
    """A copy of ``config`` whose model builds the MTP ``layers`` as further decoder layers (``num_hidden_layers``
    past the last of them; a per-layer list of the config's length gets its last entry repeated for each)."""
    if not layers:
        return config
    out = copy.deepcopy(config)
    before, after = config.num_hidden_layers, layers[-1] + 1
    for name, value in vars(config).items():
        if isinstance(value, list) and len(value) == before and name != "architectures":
            setattr(out, name, [*value, *[value[-1]] * (after - before)])
    out.num_hidden_layers = after
    return out


def config_without_mtp(config: Any, base: Any, layers: list[int]) -> None:
    """Undo `config_with_mtp` in ``config`` (a pruned model's, in place): ``base``'s ``num_hidden_layers``, its
    per-layer lists cut back, the MTP layers out of a per-layer expert count."""
    if not layers:
        return
    before = base.num_hidden_layers
    for name, value in list(vars(config).items()):
        if isinstance(value, list) and len(value) == layers[-1] + 1 and name != "architectures":
            setattr(config, name, value[:before])
        elif isinstance(value, dict) and name == "lightprune_experts_per_layer":
            setattr(config, name, {k: v for k, v in value.items() if int(k) < before})
    config.num_hidden_layers = before


def undeclared_mtp(data: dict[str, Any], keys: list[str]) -> bool:
    """For a written checkpoint's config.json ``data`` and its tensor names ``keys``: when the config declares
    multi-token-prediction layers (``num_nextn_predict_layers`` or ``mtp_num_hidden_layers`` > 0) that the weights do
    not hold (an export of a model in memory, whose class does not build them), set it to 0 in ``data``, so that the
    config agrees with the tensors; True when it did."""
    declared, count = _declared(data), data.get("num_hidden_layers")
    if declared is None or declared < 1 or not isinstance(count, int):
        return False
    numbered = (_DECODER_LAYER.match(mtp_alias(key, count)) for key in keys)
    if any(m is not None and int(m.group(1)) >= count for m in numbered):
        return False
    for name in _DECLARED:
        if name in data:
            data[name] = 0
    return True

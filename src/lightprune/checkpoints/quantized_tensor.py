"""What every quantized format lightprune reads shares: `StoredFormat` (what a format gives the reader),
`QuantizedTensor` (a logical tensor and its stored parts), `check_ignored` (a ``quantization_config``'s
``modules_to_not_convert`` against the checkpoint) and `renumbered_ignores` (an ignore list after a prune)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any, Protocol

import torch

from lightprune.core.errors import listed_text
from lightprune.core.jsonio import show

__all__ = ["QuantizedTensor", "StoredFormat", "check_found", "check_ignored", "ignores", "renumbered_ignores"]


@dataclass(frozen=True)
class QuantizedTensor:
    """One logical tensor stored quantized: ``parts`` (its stored keys, the values first, each the logical key and a
    suffix), the ``shape`` and ``dtype`` of its dequantized value."""

    parts: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype


class StoredFormat(Protocol):
    """A quantized format, checked against a checkpoint's headers when built (``ValueError`` naming what is wrong):
    its ``method`` (config.json's ``quant_method``), ``tensors`` {logical key: `QuantizedTensor`},
    `dequantize` (a logical tensor from its read parts), `record` (what a manifest says of it) and
    `loading_config` (transformers' quantization config that loads the checkpoint dequantized)."""

    method: str
    tensors: dict[str, QuantizedTensor]

    def dequantize(self, parts: dict[str, torch.Tensor], key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        ...

    def record(self) -> dict[str, Any]:
        ...

    def loading_config(self) -> Any:
        ...


def ignores(pattern: str, module: str) -> bool:
    """True when ``modules_to_not_convert`` entry ``pattern`` names ``module`` as transformers matches them
    (``should_convert_module``): from the start up to a module boundary, as a regular expression with that boundary
    (``model.layers.*.self_attn``), or as a suffix (``lm_head``)."""
    try:
        found = re.match(rf"(?:{pattern})(?:(?<=\.)|(?=\.|$))", module) is not None
    except re.error:
        found = module == pattern or module.startswith(f"{pattern}.")
    return found or module.endswith(pattern)


def check_found(path: Path, method: str, described: str, tensors: dict[str, QuantizedTensor],
                problems: dict[str, list[str]], none: str) -> None:
    """Refuse, in one line naming the checkpoint: what a format's header checks found wrong (``problems``: {what:
    the keys}; ``described``: the format, for the message), or a checkpoint that declares ``method`` but holds no
    quantized tensor (``none``: what it lacks)."""
    if not tensors and not problems:
        raise ValueError(f"checkpoint {str(path)!r} declares quant_method \"{method}\" (config.json's "
                         f"quantization_config) but {none}: a config for another checkpoint; remove its "
                         "quantization_config or restore the weights")
    if problems:
        said = "; ".join(f"{what}: {listed_text(sorted(keys))}" for what, keys in problems.items())
        raise ValueError(f"checkpoint {str(path)!r} ({described}): {said}; re-export it or restore the files")


def check_ignored(path: Path, method: str, quantization: dict[str, Any], entries: dict[str, Any],
                  quantized: dict[str, QuantizedTensor], key: str = "modules_to_not_convert",
                  matches: Callable[[str, str], bool] = ignores) -> None:
    """The ignore list ``quantization[key]``: a list of module names, each naming a module the checkpoint holds
    (``matches(entry, module)`` for a prefix of its tensors' names: `ignores`, transformers' matching, by
    default), none that holds a tensor stored quantized."""
    ignored = quantization.get(key)
    if ignored is None:
        return
    where = f"checkpoint {str(path)!r}: config.json's quantization_config"
    if not isinstance(ignored, list) or not all(isinstance(name, str) and name for name in ignored):
        raise ValueError(f"{where} has \"{key}\": {show(ignored)}; write a list of module names")
    modules = {name.rpartition(".")[0] for name in entries}
    absent = [name for name in ignored if not any(matches(name, module) for module in modules)]
    if absent:
        raise ValueError(f"{where}'s \"{key}\" names {listed_text(absent)}, which the checkpoint holds no tensors "
                         "of: a config for another checkpoint; restore it")
    converted = [name for name in quantized if any(matches(entry, name.rpartition(".")[0]) for entry in ignored)]
    if converted:
        raise ValueError(f"{where}'s \"{key}\" names modules stored quantized ({listed_text(converted)}): "
                         f"transformers would load their {method} values unscaled; restore the config")


#: an ignore-list entry naming one expert of one layer: (layer prefix, layer, experts path) . expert (rest)
_ONE_EXPERT = re.compile(r"^(?P<head>(?:model|mtp)\.layers\.(?P<layer>\d+)\..*?experts)"
                         r"\.(?P<expert>\d+)(?P<rest>\..*)?$")


def renumbered_ignores(names: list[str], keep: dict[int, list[int]], count: int) -> list[str]:
    """A quantization config's ignore list (``modules_to_not_convert``, compressed-tensors' ``ignore``) after a prune
    that keeps ``keep`` ({layer: kept expert ids}; ``count``: the model's ``num_hidden_layers``, Qwen3-Next's
    ``mtp.layers.{i}`` being layer ``count + i``): an entry naming one expert of a pruned layer follows it to its new
    number, or goes with it; a pattern (``re:``, ``*``) naming experts by number cannot be followed and is refused."""
    out = []
    for name in names:
        pattern = name.startswith("re:") or any(c in name for c in "*?+[]()|^$\\{}")
        found = None if pattern else _ONE_EXPERT.match(name)
        if found is None:
            if re.search(r"experts\W{0,3}\d", name):
                raise ValueError(f"the quantization config's ignore list names experts by number in the pattern "
                                 f"{name!r}, which pruning renumbers: write the modules it means, one entry each")
            out.append(name)
            continue
        layer = int(found["layer"]) + (count if name.startswith("mtp.") else 0)
        if layer not in keep:
            out.append(name)
        elif int(found["expert"]) in keep[layer]:
            out.append(f"{found['head']}.{keep[layer].index(int(found['expert']))}{found['rest'] or ''}")
    return out

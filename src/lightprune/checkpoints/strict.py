"""The strict half of loading a checkpoint: what would give a model with random, dropped or silently cast weights,
named before (from the headers) or after (from transformers' loading report) the load.

- `check_not_quantized`: a ``quantization_config`` in config.json;
- `check_config_values`: config.json values no model can be built or run with: a NaN or infinite number
  (JSON's ``NaN`` / ``Infinity`` constants, or a number too large for a float) anywhere in it, an activation name
  (``hidden_act``, ``*_act``, ``hidden_activation``, ``activation_function``) transformers does not know, a
  ``transformers_weights`` entry pointing transformers at other weights than lightprune reads, a ``model_type``
  (of the config or a sub-config) transformers does not know (the known name it is closest to, case first), and a
  value transformers' strict config class refuses for its field (its type, a range): an integer field (a size, a
  count, a top-k) holding a decimal number or a boolean says what to write (``8.0``: write 8), and so does a float
  field holding an integer (``1``: write 1.0, which transformers refuses too), before transformers' two-line
  ``StrictDataclassFieldValidationError`` that names neither the file nor the checkpoint;
- `expert_layout_error`: per-expert tensors on disk (``...experts.<i>.<name>``) that cannot be fused;
- `check_loading_info`: missing, unexpected and mis-shaped tensors and error messages of transformers'
  report, in the model's parameter names.

Each error names the checkpoint and the tensors (`lightprune.core.errors.listed_text`: at most 8, then
"and N more").
"""

from __future__ import annotations

import difflib
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lightprune.checkpoints.directory import SAFE_INDEX, SAFE_WEIGHTS, read_config
from lightprune.core.errors import listed_text
from lightprune.core.jsonio import show
from lightprune.core.suggestions import did_you_mean

__all__ = ["check_not_quantized", "check_config_values", "expert_layout_error", "check_loading_info", "tensors_phrase"]

_FLOAT_ONLY = "lightprune loads float checkpoints; quantized or integer weights are not supported"
_DISK_NAMES = "tensor names as stored in the safetensors files"
_MODEL_NAMES = "tensor names are the model's parameters, into which transformers fuses the per-expert tensors on disk"
_FIX = "re-export it or restore the files"
_EXPERT_KEY = re.compile(r"^(?P<prefix>(?:.+\.)?experts)\.(?P<index>\d+)\.(?P<rest>.+)$")


def tensors_phrase(n: int) -> str:
    return f"{n} tensor" if n == 1 else f"{n} tensors"


def check_not_quantized(path: Path) -> None:
    quantization = read_config(path).get("quantization_config")
    if quantization is not None:
        method = quantization.get("quant_method") if isinstance(quantization, dict) else quantization
        raise ValueError(f"checkpoint {str(path)!r} is quantized (config.json has a quantization_config, "
                         f"quant_method {method!r}): {_FLOAT_ONLY}")


def _leaves(node: dict | list, where: str = "") -> Iterator[tuple[str, str, Any]]:
    """(dotted path, key, value) of every value of a JSON tree that is not an object or a list (key "" in a list)."""
    for key, value in node.items() if isinstance(node, dict) else enumerate(node):
        name = f"{where}[{key}]" if isinstance(node, list) else f"{where}.{key}" if where else str(key)
        if isinstance(value, (dict, list)):
            yield from _leaves(value, name)
        else:
            yield name, str(key) if isinstance(node, dict) else "", value


def _is_activation_key(key: str) -> bool:
    return key.endswith("_act") or key in ("hidden_activation", "activation_function")


def _config_class(where: str, config: dict[str, Any], name: str, default: str | None = None) -> type | None:
    """transformers' config class for ``config`` as ``AutoConfig`` picks it: its ``model_type`` (``default`` when it
    has none; mistral with ``layer_types`` is ministral, as AutoConfig reads it); None without either, or with its
    own config code (``auto_map.AutoConfig``: the class is the checkpoint's). A model type transformers does not know
    is refused, naming it and the known one it is closest to (case first)."""
    from transformers import CONFIG_MAPPING

    auto_map = config.get("auto_map")
    if isinstance(auto_map, dict) and "AutoConfig" in auto_map:
        return None
    model_type = config.get("model_type", default)
    if model_type is None:
        return None
    if isinstance(model_type, str) and model_type in CONFIG_MAPPING:
        if model_type == "mistral" and "layer_types" in config and name == "model_type":
            model_type = "ministral"
        return CONFIG_MAPPING[model_type]
    if not isinstance(model_type, str):
        raise ValueError(f"{where}'s {name} is {show(model_type)}, not a model type name; write the model type "
                         "of the checkpoint's architecture (a string such as \"qwen3_moe\": transformers' "
                         "CONFIG_MAPPING lists the ones it knows)")
    known = list(CONFIG_MAPPING.keys())
    raise ValueError(f"{where}'s {name} is {show(model_type)}, a model type transformers does not know"
                     f"{did_you_mean(model_type, known)}; write the model type of the checkpoint's architecture "
                     f"(transformers' CONFIG_MAPPING lists the {len(known)} it knows)")


def _passes(checks: list[Any], value: Any) -> bool:
    try:
        for check in checks:
            check(value)
    except (TypeError, ValueError):
        return False
    return True


def _integer_given_otherwise(checks: list[Any], value: Any) -> bool:
    """True for a bool or a finite decimal number where the field's ``checks`` take an integer (its ``int``)."""
    return (isinstance(value, bool) or (isinstance(value, float) and math.isfinite(value))) and \
        not _passes(checks, value) and _passes(checks, int(value))


def _type_text(field_type: Any) -> str:
    return field_type.__name__ if isinstance(field_type, type) else str(field_type).replace("typing.", "")


def _field_error(where: str, cls: type, name: str, field: str, value: Any, checks: list[Any],
                 cause: Exception) -> ValueError:
    """The one-line refusal of config.json's ``name`` = ``value``, which ``cls``'s checks of ``field`` refuse."""
    owner = f"transformers' {cls.__name__}"
    key = name.rpartition(".")[2]
    said = f"{where}'s {name} is {show(value)}"
    if _integer_given_otherwise(checks, value):
        kind = "boolean" if isinstance(value, bool) else "number with a decimal point"
        what = str(int(value)) if isinstance(value, float) and value.is_integer() else \
            f"the model's {key} as an integer (digits only: no decimal point, not true or false)"
        return ValueError(f"{said}, a {kind} where {owner} takes an integer; write {what}")
    if isinstance(value, int) and not isinstance(value, bool) and _passes(checks, float(value)):
        return ValueError(f"{said}, an integer where {owner} takes a number with a decimal point; write "
                          f"{float(value)!r}")
    fields = getattr(cls, "__dataclass_fields__", {})
    wanted = f" ({_type_text(fields[field].type)})" if field in fields else ""
    reason = " ".join(str(cause).split())
    return ValueError(f"{said}, not what {owner} takes there ({reason}); write a value of the field's type{wanted}")


def _check_fields(where: str, cls: type, config: dict[str, Any], prefix: str = "") -> None:
    """config.json's values (``config``, at ``prefix``) through the checks transformers' strict config class
    ``cls`` runs on each field as it sets it (``__validators__``: the field's type, and ranges where it has them),
    then each sub-config (``text_config``, ...) through its own class, refused in one line before transformers
    builds it (its two-line ``StrictDataclassFieldValidationError`` names neither the file nor the checkpoint).

    A key its ``attribute_map`` ties to a field is refused only as an integer written otherwise (a decimal number, a
    boolean) where the field takes an integer: transformers checks a value by the name it is set under only, so
    Qwen3-MoE's ``num_local_experts`` (what its config.json holds, and the count lightprune reads; the field is
    ``num_experts``) would pass as ``8.0`` and build a model of 8.0 experts."""
    from transformers import PreTrainedConfig

    validators = getattr(cls, "__validators__", None) or {}
    aliases = getattr(cls, "attribute_map", None) or {}  # {another name: the attribute it stands for}
    tied = {**{target: alias for alias, target in aliases.items()}, **aliases}
    for key, value in config.items():
        field = key if key in validators else tied.get(key)
        checks = list(validators.get(field, ()))
        if field != key and not _integer_given_otherwise(checks, value):
            continue  # transformers does not check it: only an integer written otherwise is refused
        for check in checks:
            try:
                check(value)
            except (TypeError, ValueError) as cause:
                raise _field_error(where, cls, f"{prefix}{key}", field, value, checks, cause) from None
    specs = getattr(cls, "sub_configs_defaults", None) or {}
    for key, spec in specs.items():
        sub = config.get(key)
        if key == "backbone_config" or not isinstance(sub, dict):
            continue
        given = getattr(spec, "config_class", None)
        if isinstance(given, type) and issubclass(given, PreTrainedConfig):
            sub_cls = given  # transformers builds this class whatever the dict's model_type says
        else:
            sub_cls = _config_class(where, sub, f"{prefix}{key}.model_type", getattr(spec, "model_type", None))
        if sub_cls is not None:
            _check_fields(where, sub_cls, sub, f"{prefix}{key}.")


def check_config_values(path: Path, config: dict[str, Any]) -> None:
    """Refuse config.json values no model can be built or run with (the module docstring's list), naming the key."""
    from transformers.activations import ACT2FN

    where = f"checkpoint {str(path)!r}: config.json"
    for name, key, value in _leaves(config):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{where}'s {name} is {value!r}: a non-finite number gives NaN or inf outputs; set the "
                             "value the model was trained with")
        if _is_activation_key(key) and isinstance(value, str) and value not in ACT2FN:
            close = difflib.get_close_matches(value, list(ACT2FN), n=3, cutoff=0.5)
            hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
            raise ValueError(f"{where}'s {name} is {value!r}, an activation transformers does not know ({hint}the "
                             "known names: transformers.activations.ACT2FN); set the model's activation")
    weights = config.get("transformers_weights")
    if weights is not None and (weights not in (SAFE_WEIGHTS, SAFE_INDEX) or not (path / str(weights)).is_file()):
        raise ValueError(f"{where}'s transformers_weights is {weights!r}: transformers loads that file instead of "
                         f"the {SAFE_WEIGHTS} or {SAFE_INDEX} every lightprune path reads; remove the key (and name "
                         "the weights as transformers saves them)")
    cls = _config_class(where, config, "model_type")
    if cls is not None:  # the values as transformers reads them: {"__float__": "Infinity"} is inf
        decode = getattr(cls, "_decode_special_floats", None)  # (a transformers without it: the values as written)
        _check_fields(where, cls, decode(config) if decode is not None else config)


def expert_layout_error(path: Path, entries: dict[str, tuple[Path, dict[str, Any]]]) -> ValueError | None:
    """The error for per-expert tensors on disk that transformers cannot fuse, or ``None``.

    Each must exist under every tensor name of its kind of layer, for every expert index, in one shape.
    The kind of layer is the path with its numbers wildcarded (``model.layers.#.mlp.experts``): each of its
    layers must hold the same per-expert names (``gate_proj.weight``, ...) for experts ``0 .. n-1``.
    """
    layers: dict[str, dict[str, dict[int, tuple[int, ...]]]] = defaultdict(lambda: defaultdict(dict))
    for name, (_, info) in entries.items():
        match = _EXPERT_KEY.match(name)
        if match:
            layers[match["prefix"]][match["rest"]][int(match["index"])] = tuple(info["shape"])
    kinds: dict[str, set[str]] = defaultdict(set)
    for prefix, by_name in layers.items():
        kinds[re.sub(r"\.\d+\.", ".#.", prefix)].update(by_name)
    missing, odd = [], []
    for prefix, by_name in sorted(layers.items()):
        count = 1 + max(i for shapes in by_name.values() for i in shapes)
        for rest in sorted(kinds[re.sub(r"\.\d+\.", ".#.", prefix)]):
            shapes = by_name.get(rest, {})
            missing += [f"{prefix}.{i}.{rest}" for i in range(count) if i not in shapes]
            if shapes:
                common = Counter(shapes.values()).most_common(1)[0][0]
                odd += [f"{prefix}.{i}.{rest} {list(shape)} (its other experts {list(common)})"
                        for i, shape in sorted(shapes.items()) if shape != common]
    parts = []
    if missing:
        parts.append(f"lacks {tensors_phrase(len(missing))} of experts whose other tensors it has "
                     f"({listed_text(missing)})")
    if odd:
        parts.append(f"has {tensors_phrase(len(odd))} of another shape than the same tensor of the layer's other "
                     f"experts ({listed_text(odd)})")
    if not parts:
        return None
    return ValueError(f"checkpoint {str(path)!r} {'; '.join(parts)}: its per-expert tensors cannot be fused "
                      f"into the model's parameters; {_FIX} ({_DISK_NAMES})")


def check_loading_info(path: Path, info: dict[str, Any]) -> None:
    """Raise ``ValueError`` for anything transformers' loading report lists."""
    missing, unexpected = sorted(info["missing_keys"]), sorted(info["unexpected_keys"])
    mismatched, errors = sorted(info["mismatched_keys"], key=lambda item: item[0]), list(info["error_msgs"])
    parts, effects = [], []
    if missing:
        parts.append(f"is missing {tensors_phrase(len(missing))} the model needs ({listed_text(missing)})")
    if mismatched:
        parts.append(f"has {tensors_phrase(len(mismatched))} of another shape than the model's ("
                     + listed_text(f"{name} {list(disk)} on disk, {list(want)} in the model"
                                   for name, disk, want in mismatched) + ")")
    if missing or mismatched:
        effects.append("it would load with random weights")
    if unexpected:
        parts.append(f"has {tensors_phrase(len(unexpected))} the model does not have ({listed_text(unexpected)})")
        effects.append("the extra ones would be ignored")
    if errors:
        parts.append(f"failed to load ({'; '.join(errors)})")
    if parts:
        effect = f": {' and '.join(effects)}" if effects else ""
        raise ValueError(f"checkpoint {str(path)!r} {'; '.join(parts)}{effect}; {_FIX} ({_MODEL_NAMES})")


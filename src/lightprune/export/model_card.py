"""The ``README.md`` model card of an expert-pruning export: `model_card`.

A pure function of the export's facts (the ``lightprune_export.json`` manifest that
[`lightprune.export.save.save_pruned`][..save.save_pruned] writes): no file is read, nothing is imported from
transformers, the same facts give the same text. Sections, in order:

* front matter (``library_name: transformers``, tags) and a title naming the architecture;
* **Source**: the source checkpoint and its safetensors fingerprint (file names, sizes);
* **Pruning**: criterion, ratio, allocation and routed experts before / after (from the plan);
* **Kept experts**: one row per MoE layer with the ORIGINAL ids of the experts it keeps
  (the plan's ``keep``; "unknown" when the export was saved without a plan);
* **Size**: parameters, tensor bytes and safetensors bytes on disk, before and after;
* **Verification**: the largest logits difference of the reloaded checkpoint and its tolerance;
* **Evaluation**: the given evaluation results, one row per (dotted) metric name;
* **Tokenizer**: where the tokenizer / processor files came from, or that there is none;
* **Loading**: how to load it (stock ``from_pretrained`` or ``trust_remote_code=True``);
* **Reproduce**: the lightprune version and the command that wrote it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["model_card", "CARD_FILE"]

CARD_FILE = "README.md"

_REQUIRED = ("architecture", "auto_class", "uniform", "experts_per_layer", "parameters", "parameter_bytes",
             "weight_bytes", "dtype", "verification", "source", "source_fingerprint", "plan", "evaluation",
             "tokenizer", "parameters_before", "parameter_bytes_before", "weight_bytes_before",
             "lightprune_version", "command")


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]


def _count(value: int | None) -> str:
    return "unknown" if value is None else f"{int(value):,}"


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, float):
        return "null" if value is None else str(value)
    return f"{value:.6g}"


def _flatten(mapping: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            items += _flatten(value, name + ".")
        else:
            items.append((name, value))
    return items


def _fence(text: str) -> str:
    longest, run = 0, 0
    for char in text:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    return "`" * max(3, longest + 1)


def _source(info: Mapping[str, Any]) -> list[str]:
    lines = ["## Source", "", f"- checkpoint: `{info['source']}`" if info["source"] else "- checkpoint: unknown"]
    files = info["source_fingerprint"]
    if files is None:
        lines.append("- fingerprint: none (no local source checkpoint directory)")
    else:
        lines += [(f"- fingerprint: {len(files)} safetensors file(s), SHA-256 of each header "
                   "(`lightprune_export.json`, key `source_fingerprint`)"), ""]
        lines += _table(["file", "bytes", "header sha256"],
                        [[f["name"], _count(f["size"]), f["header_sha256"]] for f in files])
    return lines


def _pruning(info: Mapping[str, Any]) -> list[str]:
    plan, after = info["plan"], sum(info["experts_per_layer"].values())
    if plan is None:
        return ["## Pruning", "", "- plan: not recorded (saved with `save_pruned` without a plan)",
                f"- routed experts after: {after:,}"]
    ratio = "not recorded" if plan["ratio"] is None else _number(plan["ratio"])
    return ["## Pruning", "", f"- criterion: `{plan['criterion']}`", f"- ratio: {ratio}",
            f"- allocation: `{plan['allocation']}`",
            f"- routed experts: {sum(plan['num_experts'].values()):,} -> {after:,}"]


def _kept(info: Mapping[str, Any]) -> list[str]:
    plan, counts = info["plan"], info["experts_per_layer"]
    lines = ["## Kept experts", ""]
    if plan is None:
        lines += ["Original expert ids are unknown: no plan was given.", ""]
        return lines + _table(["layer", "kept", "of", "original expert ids"],
                              [[layer, n, "unknown", "unknown"] for layer, n in counts.items()])
    lines += [("Ids are the experts' indices in the source checkpoint; in this checkpoint they are "
               "renumbered 0..kept-1 in the same order."), ""]
    rows = [[layer, len(ids), plan["num_experts"][layer], ", ".join(str(e) for e in ids)]
            for layer, ids in plan["keep"].items()]
    return lines + _table(["layer", "kept", "of", "original expert ids"], rows)


def _size(info: Mapping[str, Any]) -> list[str]:
    rows = [["parameters", _count(info["parameters_before"]), _count(info["parameters"])],
            ["tensor bytes", _count(info["parameter_bytes_before"]), _count(info["parameter_bytes"])],
            ["safetensors bytes on disk", _count(info["weight_bytes_before"]), _count(info["weight_bytes"])]]
    return ["## Size", "", f"Weights dtype: `{info['dtype']}`.", ""] + _table(["", "before", "after"], rows)


def _tolerance(v: Mapping[str, Any]) -> str:
    """The tolerance the check applied: ``atol + rtol * max|reference|`` where the manifest records it (the streamed
    export's under ``logits``), else ``atol`` (a manifest that records no ``tolerance``)."""
    record = v if "tolerance" in v else v.get("logits") if isinstance(v.get("logits"), Mapping) else None
    if record is None or "tolerance" not in record:
        return f"tolerance {_number(float(v['atol']))}"
    return (f"tolerance {_number(float(record['tolerance']))} = atol {_number(float(record['atol']))} + rtol "
            f"{_number(float(record['rtol']))} x the reference's largest magnitude "
            f"{_number(float(record['reference_max_abs']))}")


def _verification(info: Mapping[str, Any]) -> list[str]:
    v = info["verification"]
    if v is None:
        return ["## Verification", "", "Not verified when it was written (`verify=False`)."]
    if "sequential_logits" in v:  # written shard by shard (lp.prune_checkpoint)
        every = (" and every kept expert's router row and MLP (a selection that names each)"
                 if "kept_experts" in v else "")
        return ["## Verification", "",
                ("Checked one layer at a time before it was published: each MoE layer's routed experts against the "
                 f"source layer with the pruned experts masked, on probe hidden states{every}, then probe tokens "
                 "through the whole model, layer by layer, against the masked source: the largest absolute "
                 f"difference was {_number(float(v['max_abs_diff']))} ({_tolerance(v)}).")]
    loaders = ", ".join(f"`{k}`" for k in v.get("loaders", {}))
    return ["## Verification", "",
            (f"Reloaded with {loaders or 'its loaders'} before it was written: the largest absolute logits "
             f"difference from the reference was {_number(float(v['max_abs_diff']))} "
             f"({_tolerance(v)}).")]


def _evaluation(info: Mapping[str, Any]) -> list[str]:
    evaluation = info["evaluation"]
    if not evaluation:
        return ["## Evaluation", "", "No evaluation was given."]
    return ["## Evaluation", ""] + _table(["metric", "value"], [[k, _number(v)] for k, v in _flatten(evaluation)])


def _tokenizer(info: Mapping[str, Any]) -> list[str]:
    tok = info["tokenizer"]
    if tok is None:
        return ["## Tokenizer", "", ("None: no processor was given and the source has no tokenizer files. "
                                     "Load the source model's tokenizer separately.")]
    origin = f"the given `{tok['class']}`" if tok["origin"] == "processor" else "the source checkpoint"
    return ["## Tokenizer", "", f"From {origin}: " + ", ".join(f"`{f}`" for f in tok["files"]) + "."]


def _loading(info: Mapping[str, Any]) -> list[str]:
    auto = info["auto_class"]
    if info["uniform"]:
        code = [f"from transformers import {auto}, AutoTokenizer", f'model = {auto}.from_pretrained("path")']
        note = "Every layer keeps the same number of experts: the stock transformers class loads it."
    else:
        code = [f"from transformers import {auto}", f'model = {auto}.from_pretrained("path", trust_remote_code=True)',
                "# or, with lightprune (never runs the checkpoint's code):",
                "import lightprune as lp", 'model = lp.load_pruned("path")']
        note = ("Layers keep different numbers of experts (`config.lightprune_experts_per_layer`): load it with "
                "the bundled `modeling_lightprune.py` (torch and transformers only) or with lightprune.")
    if info["uniform"] and info["tokenizer"] is not None:
        code.append('tokenizer = AutoTokenizer.from_pretrained("path")')
    if info["dtype"] == "float64":
        note += (" Its experts run transformers' `eager` implementation (config.json's `experts_implementation`: "
                 "the default `grouped_mm` kernel takes no float64), which `from_pretrained` reads from the config.")
    return ["## Loading", "", note, "", "```python", *code, "```"]


def _reproduce(info: Mapping[str, Any]) -> list[str]:
    command = str(info["command"])
    fence = _fence(command)
    return ["## Reproduce", "", f"Written by lightprune {info['lightprune_version']} with:", "",
            fence + "bash", command, fence]


def model_card(info: Mapping[str, Any]) -> str:
    """The Markdown model card for an export described by ``info`` (the manifest's keys, see the module doc)."""
    missing = [k for k in _REQUIRED if k not in info]
    if missing:
        raise ValueError(f"model_card needs the export facts {missing}; got keys {sorted(info)}")
    plan = info["plan"]
    if plan is not None and sorted(str(k) for k in plan["keep"]) != sorted(info["experts_per_layer"]):
        raise ValueError(f"model_card: the plan keeps experts of layers {sorted(plan['keep'])}, the export has "
                         f"MoE layers {sorted(info['experts_per_layer'])}")
    front = ["---", "library_name: transformers", "tags:", "- lightprune", "- mixture-of-experts",
             "- expert-pruning", "---", "",
             f"# {info['architecture']} with pruned routed experts", "",
             "Routed experts removed structurally by lightprune; the checkpoint is safetensors only."]
    sections = [front, _source(info), _pruning(info), _kept(info), _size(info), _verification(info),
                _evaluation(info), _tokenizer(info), _loading(info), _reproduce(info)]
    return "\n\n".join("\n".join(lines) for lines in sections) + "\n"

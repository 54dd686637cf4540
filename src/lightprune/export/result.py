"""What an export returns: [`ExportResult`][] (expert pruning: [`save_pruned`][..save.save_pruned],
[`export_pruned`][..pipeline.export_pruned], [`prune_checkpoint`][..streamed.prune_checkpoint]) and
[`WidthExportResult`][] ([`save_width_pruned`][..width.save_width_pruned]), with `MANIFEST_FILE`, the name
of the manifest every export writes beside its weights, and `write_manifest`, which writes an expert
export's manifest.

A result is built from the manifest the export has just written (the same dict, never read back from disk), so
its attributes are the manifest's figures::

    result = lp.export_pruned(model, plan, "out")
    result.path, result.experts_per_layer, result.parameters, result.weight_bytes, result.max_abs_diff
    model = lp.load_pruned(result)          # a result is os.PathLike: it goes wherever a path goes

A result is ``os.PathLike`` and its ``str`` is the checkpoint path, so ``Path(result)``, ``open``, ``shutil`` and
``lp.load_pruned(result)`` take it; for anything else a path offers (``/``, its methods), use ``result.path``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightprune.checkpoints.classes import auto_class_name, base_class
from lightprune.checkpoints.directory import weight_files
from lightprune.core.checks import check_utf8
from lightprune.core.jsonio import json_text, read_json
from lightprune.export.model_card import CARD_FILE, model_card

__all__ = ["MANIFEST_FILE", "ExportResult", "WidthExportResult"]

#: the manifest of every export (expert and width), beside the weights
MANIFEST_FILE = "lightprune_export.json"
#: the ``format`` of an expert export's manifest and of a width export's (export.width_format reads the latter)
EXPERT_FORMAT, WIDTH_FORMAT = "lightprune-export", "lightprune-width-export"


class _CheckpointPath(os.PathLike):
    """The checkpoint path side of a result: ``os.PathLike`` and ``str`` give ``path``. Two results are equal when
    all their fields are; a result hashes as its path. Subclasses are frozen dataclasses with a ``path``."""

    path: Path

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __eq__(self, other: object) -> bool:
        if type(other) is type(self):
            return all(getattr(self, f.name) == getattr(other, f.name) for f in dataclasses.fields(self))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.path)


@dataclass(frozen=True, eq=False)
class ExportResult(_CheckpointPath):
    """A verified expert-pruned checkpoint: where it is and the figures of its manifest (``os.PathLike``: see the
    module docstring).

    Attributes:
        path: the checkpoint directory, absolute.
        experts_per_layer: {MoE layer index: routed experts it keeps}, every MoE layer of the exported model.
        uniform: every layer keeps the same number (plain ``from_pretrained`` loads it).
        parameters, parameter_bytes: parameter count and tensor bytes of the pruned model.
        weight_bytes: bytes of the safetensors files on disk.
        parameters_before, parameter_bytes_before: of the unpruned model (``None`` when not known: a
            ``save_pruned`` without ``card``).
        weight_bytes_before: the source checkpoint's safetensors bytes (``None`` without a local source).
        verification: the manifest's verification entry (``max_abs_diff``, ``atol``, ...); ``None`` for
            ``prune_checkpoint(verify=False)``.
        manifest: the whole manifest, as written to `MANIFEST_FILE`.
        seconds: wall time of the call that returned it.
    """

    path: Path
    experts_per_layer: dict[int, int]
    uniform: bool
    parameters: int
    parameter_bytes: int
    weight_bytes: int
    parameters_before: int | None
    parameter_bytes_before: int | None
    weight_bytes_before: int | None
    verification: dict[str, Any] | None = field(repr=False)
    manifest: dict[str, Any] = field(repr=False)
    seconds: float

    @classmethod
    def from_manifest(cls, path: str | os.PathLike, manifest: Mapping[str, Any], seconds: float) -> ExportResult:
        """The result of the export at ``path`` whose manifest is ``manifest`` (`write_manifest`'s)."""
        return cls(path=Path(path).expanduser().absolute(),
                   experts_per_layer={int(k): v for k, v in manifest["experts_per_layer"].items()},
                   uniform=manifest["uniform"], parameters=manifest["parameters"],
                   parameter_bytes=manifest["parameter_bytes"], weight_bytes=manifest["weight_bytes"],
                   parameters_before=manifest["parameters_before"],
                   parameter_bytes_before=manifest["parameter_bytes_before"],
                   weight_bytes_before=manifest["weight_bytes_before"], verification=manifest["verification"],
                   manifest=dict(manifest), seconds=seconds)

    @property
    def max_abs_diff(self) -> float | None:
        """The verification's largest absolute logits difference (``None`` when not verified)."""
        return None if self.verification is None else self.verification["max_abs_diff"]


@dataclass(frozen=True, eq=False)
class WidthExportResult(_CheckpointPath):
    """A verified MWOP width checkpoint ([`save_width_pruned`][...width.save_width_pruned]): where it is and its
    manifest's facts. Not an [`ExportResult`][]: MWOP removes no parameter and no expert, so the expert
    export's figures (experts per layer, parameters before and after) have nothing to say here.

    Attributes:
        path: the checkpoint directory, absolute.
        pruned_fractions: {unit: fraction the plan prunes} (``v2v``, ``t2v``, ``t2t``, ``ffn_<modality>``).
        align: the compact FFN's channel alignment recorded for loading.
        verification: the manifest's verification entry (``max_abs_diff``, ``atol``, ...).
        manifest: the whole manifest, as written to `MANIFEST_FILE`.
        seconds: wall time of the call that returned it.
    """

    path: Path
    pruned_fractions: dict[str, float]
    align: int
    verification: dict[str, Any] = field(repr=False)
    manifest: dict[str, Any] = field(repr=False)
    seconds: float

    @classmethod
    def from_manifest(cls, path: str | os.PathLike, manifest: Mapping[str, Any],
                      seconds: float) -> WidthExportResult:
        """The result of the width export at ``path`` whose manifest is ``manifest``."""
        return cls(path=Path(path).expanduser().absolute(), pruned_fractions=dict(manifest["pruned_fractions"]),
                   align=manifest["align"], verification=manifest["verification"], manifest=dict(manifest),
                   seconds=seconds)

    @property
    def max_abs_diff(self) -> float:
        """The verification's largest absolute logits difference (at non-padding positions)."""
        return self.verification["max_abs_diff"]


def write_manifest(tmp: Path, model: nn.Module, counts: Mapping[int, int], *, parameters: int, parameter_bytes: int,
                   dtype: torch.dtype, verification: Mapping[str, Any] | None, source: str | None,
                   fingerprint: list[dict[str, Any]] | None, plan: Mapping[str, Any] | None,
                   tokenizer: Mapping[str, Any] | None, evaluation: Mapping[str, Any] | None = None,
                   parameters_before: int | None = None, parameter_bytes_before: int | None = None,
                   command: str | None = None, **extra: Any) -> dict[str, Any]:
    """Write `MANIFEST_FILE` and the model card of the expert export staged in ``tmp`` (its weights already
    there), for ``model`` (pruned; meta tensors will do) with ``counts`` experts per layer; ``extra`` keys go in
    too. Returns the manifest ([`ExportResult.from_manifest`][] makes the result of it)."""
    from lightprune import __version__

    manifest = {
        "format": EXPERT_FORMAT,
        "format_version": 1,
        "model_type": model.config.model_type,
        "architecture": base_class(model).__name__,
        "auto_class": auto_class_name(model.config),
        "uniform": len(set(counts.values())) == 1,
        "experts_per_layer": {str(k): v for k, v in sorted(counts.items())},
        "routed_experts": sum(counts.values()),
        "parameters": parameters,
        "parameter_bytes": parameter_bytes,
        "weight_bytes": sum(f.stat().st_size for f in weight_files(tmp)),
        "dtype": str(dtype).removeprefix("torch."),
        "verification": verification,
        "source": source,
        "source_fingerprint": fingerprint,
        "plan": plan,
        "tokenizer": tokenizer,
        "evaluation": evaluation,
        "parameters_before": parameters_before,
        "parameter_bytes_before": parameter_bytes_before,
        "weight_bytes_before": sum(f["size"] for f in fingerprint) if fingerprint else None,
        **extra,
        "lightprune_version": __version__,
        "command": command if command is not None else " ".join(sys.argv),
    }
    try:  # the plan and the card facts are checked up front; what else reaches the card (the command line)
        check_utf8(manifest, "the export's manifest and model card (UTF-8)")
    except ValueError as err:
        raise ValueError(f"export manifest {MANIFEST_FILE}: {err}; nothing was written") from None
    (tmp / MANIFEST_FILE).write_text(json_text(manifest, indent=2) + "\n")  # standard JSON: no NaN, no Infinity
    (tmp / CARD_FILE).write_text(model_card(manifest))
    return manifest


def record_evaluation(out_dir: str | os.PathLike, evaluation: Mapping[str, Any]) -> None:
    """Replace the ``evaluation`` of the export at ``out_dir``: an expert export's manifest and model card, a width
    export's manifest (it has no card), each rewritten whole beside itself and renamed over it: what an evaluation
    after the export measured (the card of a job that evaluates after pruning shows both ``before`` and
    ``after``). Nothing else of the export changes."""
    out_dir = Path(out_dir)
    manifest = read_json(out_dir / MANIFEST_FILE, "export manifest")
    if manifest.get("format") not in (EXPERT_FORMAT, WIDTH_FORMAT):
        raise ValueError(f"{str(out_dir)!r} is not a lightprune export (its {MANIFEST_FILE} has format "
                         f"{manifest.get('format')!r})")
    holder = "the manifest and model card it rewrites (UTF-8)"
    try:  # text the card's UTF-8 cannot hold: refused before anything is rewritten
        check_utf8(manifest, holder)
    except ValueError as err:
        raise ValueError(f"export manifest file {str(out_dir / MANIFEST_FILE)!r}: {err}; nothing was rewritten") \
            from None
    check_utf8(dict(evaluation), holder, path="evaluation")
    manifest["evaluation"] = json.loads(json.dumps(dict(evaluation)))  # plain JSON, as written at export
    files = [(MANIFEST_FILE, json_text(manifest, indent=2) + "\n")]
    if manifest["format"] == EXPERT_FORMAT:
        files.append((CARD_FILE, model_card(manifest)))
    for name, text in files:
        staged = out_dir / f".{name}.tmp-{os.getpid()}"
        try:
            staged.write_text(text, encoding="utf-8")
            os.replace(staged, out_dir / name)
        except BaseException:
            with contextlib.suppress(OSError):
                staged.unlink(missing_ok=True)
            raise

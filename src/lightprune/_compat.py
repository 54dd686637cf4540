"""The 0.1 layout's module paths, kept for one release as deprecated aliases (each warns once).

``import lightprune.plan`` (and ``from lightprune.criteria import Criterion``, a config's
``class_path: lightprune.modules.MoECausalLM``, ``python -m lightprune.report_page``) still works: a
finder placed first on ``sys.meta_path`` answers every old name with the module that now holds it, so
classes keep one identity. An old module whose names were split over several new modules (``plan``:
``ExpertPlan`` in :mod:`lightprune.experts.plan`, ``WidthPlan`` in :mod:`lightprune.width.plan`) is a
small forwarding module. Each old path warns once per process (``FutureWarning``: it is meant for the
people who wrote the config or script, not only for library authors).

A leaf: it imports lightprune modules by name only when an old path is used.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings

__all__ = ["OLD_MODULES", "OLD_NAMES", "install", "warn_once", "new_location"]

#: old module -> the module that holds its contents now
OLD_MODULES: dict[str, str] = {
    "lightprune.flops": "lightprune.width.flops",
    "lightprune.maep": "lightprune.experts.maep",
    "lightprune.plan": "lightprune.experts.plan",
    "lightprune.ranking": "lightprune.experts.ranking",
    "lightprune.report": "lightprune.reporting.report",
    "lightprune.report_page": "lightprune.reporting.page",
    "lightprune.retention": "lightprune.width.retention",
    "lightprune.scores": "lightprune.experts.scores",
    "lightprune.select": "lightprune.experts.select",
    "lightprune.sensitivity": "lightprune.experts.sensitivity",
    "lightprune.taylor": "lightprune.width.taylor",
    "lightprune.width_search": "lightprune.width.search",
    "lightprune.width_select": "lightprune.width.select",
    "lightprune.calibration": "lightprune.experts.calibration",
    "lightprune.criteria": "lightprune.experts.criteria",
    "lightprune.surgery": "lightprune.experts.mask",
    "lightprune.surgery.mask": "lightprune.experts.mask",
    "lightprune.surgery.prune": "lightprune.experts.prune",
    "lightprune.surgery.width_mask": "lightprune.width.mask",
    "lightprune.kernels": "lightprune.width.kernels",
    "lightprune.observe.path_attention": "lightprune.width.attention",
    "lightprune.models.width": "lightprune.width.layers",
    "lightprune.modules": "lightprune.finetune",
    "lightprune.finetune.sources": "lightprune.core.sources",
    "lightprune.testbed.bench_section": "lightprune.quality.bench_section",
    "lightprune.testbed.expert_quality": "lightprune.quality.expert_quality",
    "lightprune.testbed.quality_tables": "lightprune.quality.tables",
    "lightprune.testbed.results_page": "lightprune.quality.results_page",
    "lightprune.testbed.width_quality": "lightprune.quality.width_quality",
    "lightprune.data.shapes_qa": "lightprune.data.generated.shapes_qa",
    "lightprune.data.shapes_qa_datamodule": "lightprune.data.generated.shapes_qa_datamodule",
    "lightprune.data.testbed_vqa": "lightprune.data.generated.testbed_vqa",
    "lightprune.data.testbed_vqa_datamodule": "lightprune.data.generated.testbed_vqa_datamodule",
    "lightprune.data.generated_qa": "lightprune.data.generated.qa",
    "lightprune.data.synthetic": "lightprune.data.generated.synthetic",
    # 0.2: the leaves in core/, the entry chain in cli/ (lightprune.cli itself is now that package: its old names
    # are its deprecated attributes), checkpoints/ below export, stream/ dissolved into its homes
    **{f"lightprune.{name}": f"lightprune.core.{name}"
       for name in ("batch", "checks", "choices", "distributed", "errors", "extras", "jsonio", "sources")},
    "lightprune._lazy": "lightprune.core.lazy",
    "lightprune.quiet": "lightprune.cli.quiet",
    "lightprune.cli_options": "lightprune.cli.options",
    "lightprune.cli_errors": "lightprune.cli.errors",
    "lightprune.command": "lightprune.cli.command",
    "lightprune.recipe": "lightprune.cli.recipe",
    "lightprune.trainer": "lightprune.cli.trainer",
    "lightprune.export.staging": "lightprune.checkpoints.staging",
    "lightprune.export.classes": "lightprune.checkpoints.classes",
    "lightprune.export.remote_resize": "lightprune.checkpoints.resize",
    "lightprune.stream": "lightprune.checkpoints",
    "lightprune.stream.checkpoint": "lightprune.checkpoints.reader",
    "lightprune.stream.writer": "lightprune.checkpoints.writer",
    "lightprune.stream.skeleton": "lightprune.checkpoints.skeleton",
    "lightprune.stream.sequential": "lightprune.checkpoints.sequential",
    "lightprune.stream.prune": "lightprune.export.streamed",
    "lightprune.stream.verify": "lightprune.export.streamed_verify",
    "lightprune.stream.scores": "lightprune.experts.criteria.scoring",
    "lightprune.stream.calibrate": "lightprune.experts.calibration.sequential",
    # the calibration accumulator became one module per statistic: its functions live with routing KL
    "lightprune.experts.calibration.accumulate": "lightprune.experts.calibration.routing_kl",
}
#: old packages whose submodules moved with them (``lightprune.criteria.aimer`` -> ``...experts.criteria.aimer``)
_OLD_PACKAGES = ("lightprune.calibration", "lightprune.criteria", "lightprune.kernels", "lightprune.modules")

#: (old module, name) -> (new module, new name) for names that left their old module's successor
OLD_NAMES: dict[tuple[str, str], tuple[str, str]] = {
    ("lightprune.plan", "PlanError"): ("lightprune.core.errors", "PlanError"),
    ("lightprune.plan", "WidthPlan"): ("lightprune.width.plan", "WidthPlan"),
    ("lightprune.plan", "WIDTH_UNITS"): ("lightprune.width.plan", "WIDTH_UNITS"),
    ("lightprune.plan", "PATHS"): ("lightprune.width.paths", "PATHS"),
    ("lightprune.plan", "MODALITIES"): ("lightprune.width.paths", "MODALITIES"),
    ("lightprune.surgery", "prune_experts"): ("lightprune.experts.prune", "prune_experts"),
    ("lightprune.surgery", "resize_experts"): ("lightprune.experts.prune", "resize_experts"),
    ("lightprune.surgery", "mask_width"): ("lightprune.width.mask", "mask_width"),
    ("lightprune.kernels", "CompactFFNSwap"): ("lightprune.width.swap", "CompactFFNSwap"),
    ("lightprune.kernels", "swap_compact_ffn"): ("lightprune.width.swap", "swap_compact_ffn"),
    ("lightprune.kernels.compact_ffn", "CompactFFNSwap"): ("lightprune.width.swap", "CompactFFNSwap"),
    ("lightprune.kernels.compact_ffn", "swap_compact_ffn"): ("lightprune.width.swap", "swap_compact_ffn"),
    ("lightprune.observe.path_attention", "path_masks"): ("lightprune.width.paths", "path_masks"),
    ("lightprune.observe.path_attention", "path_keep"): ("lightprune.width.paths", "path_keep"),
    ("lightprune.report_page", "ReportPage"): ("lightprune.callbacks.report_page", "ReportPage"),
    ("lightprune.modules", "base_model_of"): ("lightprune.models.unwrap", "base_model_of"),
    ("lightprune.modules.adapters", "base_model_of"): ("lightprune.models.unwrap", "base_model_of"),
    ("lightprune.sensitivity", "unwrap_model"): ("lightprune.models.unwrap", "base_model_of"),
    **{("lightprune.models.width", n): ("lightprune.width.paths", n)
       for n in ("SYSTEM", "VISION", "TEXT", "PAD", "MODALITY_NAMES")},
    **{("lightprune.models.width", n): ("lightprune.width.modality", n) for n in ("token_modality", "token_profile")},
    ("lightprune.stream", "score_weights"): ("lightprune.experts.criteria", "score_weights"),
    ("lightprune.stream", "score_checkpoint"): ("lightprune.experts.criteria", "score_checkpoint"),
    ("lightprune.stream", "prune_checkpoint"): ("lightprune.export", "prune_checkpoint"),
    ("lightprune.stream", "collect_expert_stats"): ("lightprune.experts.calibration", "collect_expert_stats"),
    ("lightprune.stream", "collect_checkpoint_stats"): ("lightprune.experts.calibration", "collect_checkpoint_stats"),
    ("lightprune.stream.checkpoint", "SAFETENSORS_DTYPES"): ("lightprune.checkpoints.header", "SAFETENSORS_DTYPES"),
    ("lightprune.stream.calibrate", "collect_expert_stats"): ("lightprune.experts.calibration", "collect_expert_stats"),
}

_WARNED: set[str] = set()


def warn_once(old: str, new: str) -> None:
    """One ``FutureWarning`` per old name and process."""
    if old in _WARNED:
        return
    _WARNED.add(old)
    warnings.warn(f"{old} is deprecated and will be removed in the next release; use {new}", FutureWarning,
                  stacklevel=3)


def new_location(old: str) -> str | None:
    """The module that holds old module ``old`` now (None: not an old path)."""
    if old in OLD_MODULES:
        return OLD_MODULES[old]
    for package in _OLD_PACKAGES:
        if old.startswith(package + "."):
            return OLD_MODULES[package] + old[len(package):]
    return None


def _forwarding_module(old: str, target: types.ModuleType) -> types.ModuleType:
    moved = {name: where for (module, name), where in OLD_NAMES.items() if module == old}
    forward = types.ModuleType(old, target.__doc__)

    def __getattr__(name: str):
        if name in moved:
            module, new = moved[name]
            return getattr(importlib.import_module(module), new)
        return getattr(target, name)

    forward.__getattr__ = __getattr__  # type: ignore[attr-defined]
    forward.__all__ = sorted(set(getattr(target, "__all__", ())) | set(moved))  # type: ignore[attr-defined]
    if hasattr(target, "__path__"):
        forward.__path__ = []  # type: ignore[attr-defined]  # a package: its old submodules come through the finder
    return forward


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def create_module(self, spec):
        warn_once(self.old, self.new)
        target = importlib.import_module(self.new)
        if any(module == self.old for module, _ in OLD_NAMES):
            return _forwarding_module(self.old, target)
        self._spec = target.__spec__
        return target

    def exec_module(self, module) -> None:
        if module.__name__ == self.new:  # the real module: importlib gave it the alias spec; give its own back
            module.__spec__ = self._spec

    def get_code(self, fullname: str):  # python -m OLD runs the new module's code
        warn_once(self.old, self.new)
        spec = importlib.util.find_spec(self.new)
        return spec.loader.get_code(self.new)

    def is_package(self, fullname: str) -> bool:
        return False


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = new_location(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(fullname, new))


_FINDER = _AliasFinder()


def install() -> None:
    """Put the alias finder first on ``sys.meta_path`` (idempotent)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)

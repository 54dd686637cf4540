"""The 0.1 module paths and names keep working for one release: the same objects, one FutureWarning each."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
import warnings

import pytest

import lightprune as lp
from lightprune import _compat


def _fresh(old: str):
    """Import ``old`` as a process that never saw it would (drop it and forget the warning)."""
    for name in [m for m in sys.modules if m == old or m.startswith(old + ".")]:
        del sys.modules[name]
    _compat._WARNED.discard(old)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    return module, [w for w in seen if issubclass(w.category, FutureWarning)]


@pytest.mark.parametrize(("old", "name", "new"), [
    ("lightprune.plan", "ExpertPlan", "lightprune.experts.plan"),
    ("lightprune.plan", "WidthPlan", "lightprune.width.plan"),
    ("lightprune.plan", "PlanError", "lightprune.core.errors"),
    ("lightprune.scores", "ExpertScores", "lightprune.experts.scores"),
    ("lightprune.criteria", "register_criterion", "lightprune.experts.criteria"),
    ("lightprune.criteria", "Criterion", "lightprune.experts.criteria"),
    ("lightprune.surgery", "mask_width", "lightprune.width.mask"),
    ("lightprune.surgery", "prune_experts", "lightprune.experts.prune"),
    ("lightprune.kernels", "swap_compact_ffn", "lightprune.width.swap"),
    ("lightprune.kernels.compact_ffn", "CompactModalityFFN", "lightprune.width.kernels.compact_ffn"),
    ("lightprune.models.width", "token_modality", "lightprune.width.modality"),
    ("lightprune.models.width", "find_width_layers", "lightprune.width.layers"),
    ("lightprune.modules", "MoECausalLM", "lightprune.finetune"),
    ("lightprune.modules.adapters", "base_model_of", "lightprune.models.unwrap"),
    ("lightprune.sensitivity", "unwrap_model", "lightprune.models.unwrap"),
    ("lightprune.calibration.collect", "collect_expert_stats", "lightprune.experts.calibration.collect"),
    ("lightprune.report_page", "ReportPage", "lightprune.callbacks.report_page"),
    ("lightprune.testbed.quality_tables", "text_tables", "lightprune.quality.tables"),
    ("lightprune.stream", "Checkpoint", "lightprune.checkpoints"),
    ("lightprune.stream", "prune_checkpoint", "lightprune.export"),
    ("lightprune.stream", "score_weights", "lightprune.experts.criteria"),
    ("lightprune.stream", "collect_expert_stats", "lightprune.experts.calibration"),
    ("lightprune.stream.writer", "SafetensorsWriter", "lightprune.checkpoints.writer"),
    ("lightprune.trainer", "PruneTrainer", "lightprune.cli.trainer"),
    ("lightprune.jsonio", "write_json", "lightprune.core.jsonio"),
    ("lightprune.export.staging", "staging_dir", "lightprune.checkpoints.staging"),
])
def test_old_path_gives_the_object_that_lives_at_the_new_one(old: str, name: str, new: str) -> None:
    module, warned = _fresh(old)
    value = getattr(module, name)
    target = importlib.import_module(new)
    expected = getattr(target, "base_model_of" if name == "unwrap_model" else name)
    assert value is expected
    assert len([w for w in warned if str(w.message).startswith(f"{old} is deprecated")]) == 1
    with warnings.catch_warnings(record=True) as again:  # once per process
        warnings.simplefilter("always")
        importlib.import_module(old)
    assert not [w for w in again if issubclass(w.category, FutureWarning)]


def test_a_moved_module_keeps_its_own_spec() -> None:
    _fresh("lightprune.select")
    import lightprune.experts.select as select

    assert sys.modules["lightprune.select"] is select
    assert select.__spec__.name == "lightprune.experts.select"


def test_old_family_names_and_old_submodule_attributes() -> None:
    from lightprune.models import FAMILIES, MoEFamily, get_family

    _compat._WARNED.clear()
    with pytest.warns(FutureWarning, match="lightprune.get_adapter"):
        assert lp.get_adapter is get_family
    import lightprune.models as models

    with pytest.warns(FutureWarning, match="MoEAdapter"):
        assert models.MoEAdapter is MoEFamily
    with pytest.warns(FutureWarning, match="ADAPTERS"):
        assert models.ADAPTERS is FAMILIES
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        lp.nothing_here  # noqa: B018


def test_python_dash_m_old_report_page_still_writes_the_page(tmp_path) -> None:
    (tmp_path / "plan.json").write_text(json.dumps({"keep": {"0": [0, 1]}, "num_experts": {"0": 4}}))
    done = subprocess.run([sys.executable, "-m", "lightprune.report_page", str(tmp_path)], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "report.md").is_file()
    assert "lightprune.report_page is deprecated" in done.stderr


def test_unknown_old_looking_paths_are_not_invented() -> None:
    assert _compat.new_location("lightprune.criteria.aimer") == "lightprune.experts.criteria.aimer"
    assert _compat.new_location("lightprune.experts.plan") is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("lightprune.no_such_module")


def test_the_old_calibration_tuple_is_the_registry_s_calibration_criteria() -> None:
    from lightprune.callbacks import expert_pruning
    from lightprune.experts.calibration import CRITERIA

    _compat._WARNED.discard("lightprune.callbacks.expert_pruning.CALIBRATION")
    with pytest.warns(FutureWarning, match="available_criteria"):
        names = expert_pruning.CALIBRATION
    assert set(names) == set(CRITERIA) | {"maep"}  # 0.1's tuple: the statistics and MAEP


def test_the_old_cli_module_names_are_deprecated_attributes_of_the_cli_package() -> None:
    import lightprune.cli as cli
    import lightprune.cli.app as app

    _compat._WARNED.discard("lightprune.cli.cli_main")
    with pytest.warns(FutureWarning, match="lightprune.cli.cli_main is deprecated"):
        assert cli.cli_main is app.cli_main
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        cli.nope  # noqa: B018


def test_moved_names_of_export_load_warn_and_resolve() -> None:
    import lightprune.export.load as load
    from lightprune.checkpoints.directory import weight_files

    _compat._WARNED.discard("lightprune.export.load.weight_files")
    with pytest.warns(FutureWarning, match="lightprune.checkpoints.directory.weight_files"):
        assert load.weight_files is weight_files


def test_every_old_path_leads_to_a_current_module() -> None:
    """No alias points at another alias (a user would get two warnings, the second naming a path that is old too)."""
    targets = set(_compat.OLD_MODULES.values()) | {module for module, _ in _compat.OLD_NAMES.values()}
    assert not [t for t in sorted(targets) if _compat.new_location(t) is not None]
    for target in sorted(targets):
        assert importlib.util.find_spec(target) is not None, target

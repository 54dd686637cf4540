"""Optional dependencies: a feature whose extra is missing fails with one line naming the extra to install."""

from __future__ import annotations

import importlib.util
import sys

import pytest

import lightprune
from lightprune.core.extras import EXTRAS, MissingExtraError, missing, require


def _block(monkeypatch, module: str) -> None:
    """Make ``import module`` fail as if the package were not installed."""
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_require_names_the_extra_when_its_module_is_missing(monkeypatch, extra) -> None:
    module = EXTRAS[extra][0]
    _block(monkeypatch, module)
    with pytest.raises(MissingExtraError) as err:
        require(extra, "this feature")
    assert str(err.value) == (f"this feature needs {module!r}, which is not installed: "
                              f"pip install 'lightprune[{extra}]'")
    assert isinstance(err.value, ImportError) and MissingExtraError in lightprune.core.errors.ERRORS  # one CLI line


def test_an_unknown_extra_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown extra 'cuda'; lightprune's extras are"):
        missing("cuda", "x")


def test_qlora_features_name_the_qlora_extra(monkeypatch) -> None:
    import torch

    from lightprune.finetune.optim import build_optimizer
    from lightprune.finetune.quantize import quantize_4bit

    _block(monkeypatch, "bitsandbytes")
    params = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(MissingExtraError, match=r"optimizer='adamw8bit' .*pip install 'lightprune\[qlora\]'"):
        build_optimizer(params, name="adamw8bit")
    assert type(build_optimizer(params, name="adamw")).__name__ == "AdamW"  # the plain optimizer needs nothing
    with pytest.raises(MissingExtraError, match=r"load_in_4bit=True needs 'bitsandbytes'.*lightprune\[qlora\]"):
        quantize_4bit(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_the_triton_backend_names_the_triton_extra(monkeypatch) -> None:
    from lightprune.width.kernels import path_attention

    real = importlib.util.find_spec
    monkeypatch.setattr(path_attention.importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    with pytest.raises(MissingExtraError, match=r"backend 'triton' on cpu needs 'triton'.*lightprune\[triton\]"):
        path_attention.check_backend("triton", "cpu")
    path_attention.check_backend("sdpa", "cpu")  # the others need nothing


def test_a_deepspeed_strategy_without_deepspeed_names_the_extra(monkeypatch) -> None:
    from lightning.pytorch.strategies import deepspeed as lightning_deepspeed

    from lightprune.cli.trainer import PruneTrainer

    monkeypatch.setattr(lightning_deepspeed, "_DEEPSPEED_AVAILABLE", False)
    with pytest.raises(MissingExtraError) as err:
        PruneTrainer(strategy="deepspeed_stage_2", logger=False, enable_progress_bar=False)
    assert str(err.value) == ("a DeepSpeed strategy needs 'deepspeed', which is not installed: "
                              "pip install 'lightprune[deepspeed]'")


def test_the_cli_reports_a_missing_deepspeed_in_one_line(monkeypatch, capsys, tmp_path) -> None:
    """A DeepSpeed strategy from a config file (built by the argument parser, before the trainer) fails the same way:
    one line and exit status 2, nothing run."""
    from fixtures import REPO
    from lightning.pytorch.strategies import deepspeed as lightning_deepspeed

    from lightprune.cli.app import main

    monkeypatch.setattr(lightning_deepspeed, "_DEEPSPEED_AVAILABLE", False)
    monkeypatch.setattr(sys, "argv", ["lightprune", "fit", "--config",
                                      str(REPO / "configs" / "router_lora_testbed.yaml"),
                                      "--trainer.default_root_dir", str(tmp_path),
                                      "--trainer.strategy", str(REPO / "configs" / "deepspeed" / "stage2.yaml")])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "lightprune: error: a DeepSpeed strategy needs 'deepspeed', which is not installed: "
        "pip install 'lightprune[deepspeed]'")
    assert not any(tmp_path.iterdir())  # nothing ran


def test_m_smoe_alignment_names_the_merging_extra(monkeypatch, tiny) -> None:
    from lightprune.experts.merging.align import neuron_permutation
    from lightprune.models import find_moe_layers

    experts = find_moe_layers(tiny("mixtral"))[0].experts
    _block(monkeypatch, "scipy.optimize")
    with pytest.raises(MissingExtraError, match=r"M-SMoE's neuron alignment \(align: true\) needs 'scipy\.optimize'.*"
                                                r"lightprune\[merging\]"):
        neuron_permutation(experts, 0, 1)


def test_m_smoe_with_alignment_is_refused_when_built_not_after_calibration(monkeypatch) -> None:
    """The criterion a job names is built before the calibration pass: without scipy, MSMoE(align=True) is refused
    there (it was refused only when the merge ran, after the whole pass); align=False needs nothing."""
    from lightprune.experts.criteria import MSMoE

    _block(monkeypatch, "scipy.optimize")
    with pytest.raises(MissingExtraError, match=r"M-SMoE's neuron alignment \(align: true\) needs 'scipy\.optimize'"):
        MSMoE(align=True)
    assert MSMoE(align=False).align is False

"""Lightning's ``64-true`` converts the module to float64, which transformers' default ``grouped_mm`` experts cannot
run: the module's experts then run transformers' ``eager`` ones, with the logits of a float64 model built eager."""

from __future__ import annotations

import warnings

import pytest
import torch
from lightning.pytorch.plugins import DoublePrecision

from lightprune.export.verify import default_probe, model_logits
from lightprune.finetune import MoECausalLM
from lightprune.testing.tiny import tiny_model


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_64_true_conversion_runs_the_experts_as_an_eager_float64_model(family) -> None:
    module = MoECausalLM(tiny=family)
    module.configure_model()
    assert module.model.config._experts_implementation == "grouped_mm"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert DoublePrecision().convert_module(module) is module  # what the strategy's setup runs
    assert module.model.config._experts_implementation == "eager"
    want = tiny_model(family, seed=0).to(torch.float64)
    want.set_experts_implementation("eager")
    probe = default_probe(want)
    got = model_logits(module.model, probe)
    assert torch.equal(got, model_logits(want, probe)) and torch.isfinite(got).all()

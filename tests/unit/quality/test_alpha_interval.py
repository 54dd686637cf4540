"""MAEP's alpha with its bootstrap interval over the calibration samples (quality/alpha_interval.py): each sample
observed alone, every resample's a and b equal to the closed form on a pass over that resample's samples (duplicates
and all), the whole set's equal to lightprune.experts.maep.maep_alpha on one pass over every sample."""

from __future__ import annotations

import warnings

import pytest
import torch

import lightprune as lp
from lightprune.core.batch import model_inputs
from lightprune.experts.maep import maep_alpha
from lightprune.quality.alpha_interval import SUBSETS, alpha_interval, bootstrap_alpha, sample_delta_h
from lightprune.testbed.vqa_models import VQA_TESTBEDS, datamodule, vqa_testbed

PRESET = "mllm-moe-canvas-micro"


@pytest.fixture(scope="module")
def setup(testbed_root):
    folder = vqa_testbed(PRESET, testbed_root, progress=False)
    model = lp.load_pruned(folder / "model").eval()
    dm = datamodule(VQA_TESTBEDS[PRESET], str(folder / "model"), testbed_root, batch_size=1)
    dm.setup("fit")
    return model, [model_inputs(b) for b in dm.dataloader("calibration")]


def _closed_form(model, batches) -> tuple[float, float]:
    stats = lp.collect_expert_stats(model, batches, subsets=SUBSETS, criteria=("delta_h",), progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = maep_alpha(stats, check=False)
    return report.a, report.b


def test_the_whole_set_and_every_resample_give_the_closed_form_of_their_samples(setup) -> None:
    model, batches = setup
    values, present, layers = sample_delta_h(model, batches, progress=False)
    assert values.shape == (len(batches), 3, len(layers), 8) and present[:, 0].all()
    assert not present[:, 1].all() and present[:, 1].any()  # text rows have no vision tokens, pictures do
    a, b = _closed_form(model, batches)
    point = bootstrap_alpha(values, present, torch.ones(1, len(batches)))
    assert float(point["a"][0]) == pytest.approx(a, abs=1e-9) and float(point["b"][0]) == pytest.approx(b, abs=1e-9)
    assert float(point["alpha"][0]) == pytest.approx(a / (a + b), abs=1e-9)
    gen = torch.Generator().manual_seed(5)
    for _ in range(3):
        index = torch.randint(0, len(batches), (len(batches),), generator=gen)
        counts = torch.zeros(1, len(batches)).scatter_add_(1, index.unsqueeze(0), torch.ones(1, len(batches)))
        drawn = bootstrap_alpha(values, present, counts)
        a, b = _closed_form(model, [batches[i] for i in index.tolist()])
        assert float(drawn["a"][0]) == pytest.approx(a, abs=1e-9) and float(drawn["b"][0]) == pytest.approx(b, abs=1e-9)


def test_the_interval_record_and_its_checks(setup) -> None:
    model, batches = setup
    out = alpha_interval(model, batches, resamples=40, seed=1, progress=False)
    assert out["samples"] == len(batches) and out["resamples"] == 40
    a, b = _closed_form(model, batches)
    assert out["a"] == pytest.approx(a, abs=1e-9) and out["b"] == pytest.approx(b, abs=1e-9)
    assert out["a_ci"][0] <= out["a_ci"][1] and out["b_ci"][0] <= out["b_ci"][1]
    assert out["a_excludes_zero"] == (out["a_ci"][0] > 0 or out["a_ci"][1] < 0)
    assert set(out["layers"]) == {str(l) for l in lp.collect_expert_stats(
        model, batches[:1], subsets=("text",), criteria=("delta_h",), progress=False).raw("delta_h", "text")}
    assert alpha_interval(model, batches, resamples=40, seed=1, progress=False) == out  # seeded
    two = {k: torch.cat([v, v]) if isinstance(v, torch.Tensor) and v.dim() else v for k, v in batches[0].items()}
    with pytest.raises(ValueError, match="one sample at a time; batch 0 has 2 rows"):
        sample_delta_h(model, [two], progress=False)
    with pytest.raises(ValueError, match="resamples must be an int >= 2, got 1"):
        alpha_interval(model, batches, resamples=1, progress=False)

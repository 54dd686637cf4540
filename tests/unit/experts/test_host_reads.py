"""The observed calibration pass reads nothing back from the device per layer and batch: on a GPU every such read
(``.item()``, ``.tolist()``, ``bool(tensor)``, ``nonzero``, ``unique``) waits for the queued kernels, so the layer's
copy to the device could not overlap the compute. Counted here on the CPU by patching the reads; the GPU test under
``torch.cuda.set_sync_debug_mode("error")`` is in tests/unit/checkpoints/test_streamed_device.py."""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest
import torch

import lightprune as lp
from lightprune.experts.calibration import ExpertObserver
from lightprune.experts.criteria.registry import DEFAULT_CRITERIA
from lightprune.models import find_moe_layers
from lightprune.testing.batches import tiny_text_batch

#: the Tensor methods that read a value back to the host
READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "cpu", "numpy")


@pytest.fixture
def host_reads(monkeypatch):
    """A Counter of the host reads made while ``counting[0]`` is True, by (read, lightprune file, line)."""
    import traceback

    package = str(Path(lp.__file__).parent) + os.sep  # the package's own files, wherever the checkout is
    counts: collections.Counter = collections.Counter()
    counting = [False]

    def counted(name, original):
        def read(*args, **kwargs):
            if counting[0]:
                frames = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(package)]
                where = (frames[-1].filename.removeprefix(package), frames[-1].lineno) if frames else None
                counts[(name, where)] += 1
            return original(*args, **kwargs)
        return read

    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
    for name in ("nonzero", "unique", "bincount"):
        monkeypatch.setattr(torch, name, counted(f"torch.{name}", getattr(torch, name)))
    return counts, counting


def _pass(model, batches, criteria, counting) -> None:
    observer = ExpertObserver(model, ("all", "text"), criteria)
    with observer, torch.no_grad():
        for batch in batches:
            observer.begin_batch(batch)
            counting[0] = True
            model(**batch)
            counting[0] = False
        counting[0] = True
        observer.check_routing()  # the pass's one read of its queued checks
        counting[0] = False


@pytest.mark.parametrize("criteria", [DEFAULT_CRITERIA, ("frequency", "expert_outputs", "router_logits")])
def test_the_observed_pass_reads_back_once_per_layer_and_pass_not_per_batch(tiny, host_reads, criteria):
    """Qwen3-MoE (removals in closed form), padded batches: the forwards of 2 and of 5 batches make one read inside
    lightprune, the pass's read of its queued checks (each batch's routing and each layer's routing tensors); none
    per layer or batch. The merging statistics weigh padding 0 instead of reading how many tokens are real; the
    experts' rows are counted per expert on the device."""
    from lightprune.experts.calibration import observed

    model = tiny("qwen3_moe", seed=4).eval()
    counts, counting = host_reads
    totals = []
    for count in (2, 5):
        counts.clear()
        batches = [tiny_text_batch(model, batch_size=2, seq_len=9, seed=s, pad=True) for s in range(count)]
        _pass(model, batches, criteria, counting)
        ours = {where: n for where, n in counts.items() if where[1] is not None}
        totals.append(sum(ours.values()))
        assert ours == {("__int__", ("experts/calibration/observed.py", observed.FiniteRoutingChecks.raise_first
                                     .__code__.co_firstlineno + 6)): 1}, ours
    assert totals[0] == totals[1] == 1, totals


def test_a_non_finite_batch_is_still_named_after_the_pass_reads_its_checks(tiny):
    """The queued check names the first bad batch and layer, as the check at the batch did: batch 1 of 3, the first
    MoE layer, its first token."""
    model = tiny("qwen3_moe", seed=4).eval()
    batches = [tiny_text_batch(model, batch_size=2, seq_len=6, seed=s) for s in range(3)]
    embedding = model.get_input_embeddings().weight
    with torch.no_grad():
        embedding[batches[1]["input_ids"][0, 0]] = float("nan")
    layer = find_moe_layers(model)[0]
    with pytest.raises(ValueError, match=rf"^calibration batch 1, MoE layer {layer.index} \({layer.name}\): \d+ of \d+ "
                                         r"tokens have a NaN or inf router input \(\d+\) or router logits \(\d+\), "
                                         r"the first at sample 0, position 0;"):
        lp.collect_expert_stats(model, batches, progress=False)

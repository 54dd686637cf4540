"""Streamed calibration across processes: 2 gloo ranks, each given half the batches, return on every rank the
statistics of all the batches, the sum of each rank's float64 sums, exactly; a rank that fails stops the other
instead of leaving it waiting in the sums."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import lightprune as lp
from lightprune.core.batch import model_inputs
from lightprune.experts.calibration import CRITERIA, ExpertObserver
from lightprune.testing.batches import tiny_text_batch

pytestmark = pytest.mark.exhaustive  # the exhaustive tier only: two processes per test


SUBSETS = ("all", "text")

WORKER = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    rank, world, port, ckpt, batches, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], *sys.argv[4:]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    import lightprune as lp
    from lightprune.experts.calibration import CRITERIA
    try:
        mine = torch.load(batches, weights_only=True)[rank::world]
        stats = lp.collect_expert_stats(ckpt, mine, subsets=("all", "text"), criteria=CRITERIA, progress=False,
                                        batches_per_pass=2)
        torch.save({"raw": {f"{c}|{s}": stats.raw(c, s) for c in stats.metadata["criteria"] for s in ("all", "text")},
                    "tokens": stats.tokens, "samples": stats.samples, "metadata": stats.metadata}, out)
    finally:
        dist.destroy_process_group()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(tmp_path: Path, ckpt: Path, batches: list, world: int = 2) -> list[subprocess.CompletedProcess]:
    torch.save(batches, tmp_path / "batches.pt")
    (tmp_path / "worker.py").write_text(WORKER)
    port = str(_free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "worker.py"), str(r), str(world), port, str(ckpt),
                               str(tmp_path / "batches.pt"), str(tmp_path / f"rank{r}.pt")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in range(world)]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def _share_state(model, batches) -> dict:
    observer = ExpertObserver(model, SUBSETS, CRITERIA)
    with observer, torch.no_grad():
        for batch in batches:
            batch = model_inputs(batch)
            observer.begin_batch(batch)
            model(**batch)
    return observer.state_dict()


@pytest.mark.distributed
def test_two_ranks_give_every_rank_the_sum_of_their_sums(tiny, tmp_path):
    """Every rank's statistics equal, bit for bit, those of one observer loaded with the sum of each share's float64
    sums (each share run in one process, in memory: the streamed pass equals it bit for bit), and the one-process
    pass over all the batches within float64 rounding (the sums added in another order)."""
    model = tiny("deepseek_v3", seed=5).eval()
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt, max_shard_size="20KB")
    batches = [tiny_text_batch(model, batch_size=2, seq_len=8, seed=s, pad=s % 2 == 0) for s in range(5)]
    runs = _run_ranks(tmp_path, ckpt, batches)
    assert [r.returncode for r in runs] == [0, 0], [r.stderr[-3000:] for r in runs]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks run: a GEMM split over other thread counts may round otherwise
    try:
        shares = [_share_state(model, batches[r::2]) for r in range(2)]
        one_process = lp.collect_expert_stats(model, batches, subsets=SUBSETS, criteria=CRITERIA, progress=False)
    finally:
        torch.set_num_threads(threads)
    summed = {"batches_seen": shares[0]["batches_seen"] + shares[1]["batches_seen"]}
    for group in shares[0]:
        if group != "batches_seen":
            summed[group] = {layer: {name: shares[0][group][layer][name] + shares[1][group][layer][name]
                                     for name in sums} for layer, sums in shares[0][group].items()}
    expected = ExpertObserver(model, SUBSETS, CRITERIA)
    expected.load_state_dict(summed)
    expected = expected.result()
    for r in range(2):
        got = torch.load(tmp_path / f"rank{r}.pt", weights_only=False)
        assert got["tokens"] == expected.tokens == one_process.tokens
        assert got["samples"] == expected.samples
        assert got["metadata"]["batches"] == 5 and got["metadata"]["ranks"] == 2
        for criterion in CRITERIA:
            for subset in SUBSETS:
                for layer, values in expected.raw(criterion, subset).items():
                    have = got["raw"][f"{criterion}|{subset}"][layer]
                    assert torch.equal(have, values), (r, criterion, subset, layer)
                    torch.testing.assert_close(have, one_process.raw(criterion, subset)[layer], rtol=1e-12,
                                               atol=1e-15)


@pytest.mark.distributed
def test_a_rank_that_fails_stops_the_other_naming_it(tiny, tmp_path):
    """Rank 1's second batch holds a token id past the vocabulary: rank 1 raises its IndexError, rank 0 raises
    RankFailedError naming rank 1, and neither waits in the sums (the run ends well inside its timeout)."""
    model = tiny("qwen3_moe", seed=5).eval()
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    batches = [tiny_text_batch(model, batch_size=1, seq_len=6, seed=s) for s in range(4)]
    batches[3]["input_ids"][0, 2] = model.config.vocab_size + 7
    runs = _run_ranks(tmp_path, ckpt, batches)
    assert runs[0].returncode != 0 and runs[1].returncode != 0
    assert "RankFailedError: rank 1 failed, so this rank stops too: IndexError" in runs[0].stderr, runs[0].stderr[-2000:]
    assert "IndexError" in runs[1].stderr and "RankFailedError" not in runs[1].stderr
    assert not (tmp_path / "rank0.pt").exists() and not (tmp_path / "rank1.pt").exists()

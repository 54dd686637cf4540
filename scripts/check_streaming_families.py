"""Every tiny family through the out-of-core paths, against the in-memory ones (a check, minutes; not in the suite).

For each family of ``lightprune.testing.tiny.TINY_FAMILIES`` (or ``--families``): the tiny model saved in shards of
50 KB, then

- ``lp.score_weights(path, "aimer")`` equal to the loaded model's, value for value;
- ``lp.prune_checkpoint(path, plan, out)`` (AIMER, half the experts, verification on, atol 1e-4) reloaded equal to
  ``lp.prune_experts`` of the model, tensor by tensor;
- ``lp.collect_expert_stats(path, batches, criteria=every one, batches_per_pass=1)`` equal to the in-memory pass on
  two text batches, value for value.

    python scripts/check_streaming_families.py [--families qwen3_moe,deepseek_v3]

Prints one line per family and exits 1 when any differs or fails.
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def check(family: str, work: str) -> str:
    import lightprune as lp
    from lightprune.experts.calibration import CRITERIA
    from lightprune.testing.batches import tiny_text_batch
    from lightprune.testing.tiny import tiny_model

    model = tiny_model(family, seed=0).eval()
    path = os.path.join(work, family)
    model.save_pretrained(path, max_shard_size="50KB")
    expected = lp.score_weights(model, "aimer")
    streamed = lp.score_weights(path, "aimer", progress=False)
    if any(not torch.equal(expected.raw[i], streamed.raw[i]) for i in expected.raw):
        return "streamed scores differ"
    plan = lp.select_experts(expected, ratio=0.5)
    out = lp.prune_checkpoint(path, plan, os.path.join(work, f"{family}-pruned"), progress=False, atol=1e-4)
    want = lp.prune_experts(copy.deepcopy(model), plan).state_dict()
    got = lp.load_pruned(out).state_dict()
    if want.keys() != got.keys() or any(not torch.equal(want[k], got[k]) for k in want):
        return "pruned checkpoint differs from the pruned model"
    batches = [tiny_text_batch(model, seed=s) for s in range(2)]
    kwargs = dict(subsets=("all", "text"), criteria=CRITERIA, progress=False)
    memory = lp.collect_expert_stats(model, batches, **kwargs)
    layered = lp.collect_expert_stats(path, batches, batches_per_pass=1, **kwargs)
    bad = [(c, u, i) for c in memory.criteria for u in memory.subsets for i in memory.raw(c, u)
           if not torch.equal(memory.raw(c, u)[i], layered.raw(c, u)[i])]
    return f"sequential statistics differ: {bad[:3]}" if bad else "ok"


def main(argv: list[str] | None = None) -> int:
    from lightprune.testing.tiny import TINY_FAMILIES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(TINY_FAMILIES))
    args = parser.parse_args(argv)
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in families if f not in TINY_FAMILIES]
    if unknown:
        parser.error(f"--families: unknown {unknown}; choose from {list(TINY_FAMILIES)}")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="lightprune-streaming-") as work:
        for family in families:
            try:
                result = check(family, work)
            except Exception:  # noqa: BLE001 - reported per family
                result = "error: " + traceback.format_exc(limit=3).strip().splitlines()[-1]
            failed += result != "ok"
            print(f"{family:28s} {result}", flush=True)
    print(f"{len(families) - failed} of {len(families)} families: streamed == in memory")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

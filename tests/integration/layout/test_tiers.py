"""The quick tier (tests/fixtures/tiers.py) on made-up collections: what it keeps is checked against the rule stated
in its docstring, case by case, and on the suite itself through pytest's own collection."""

from __future__ import annotations

import random
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest
from fixtures import REPO
from fixtures.tiers import PER_SWEEP, SWEEP_MIN, family_of, quick_tier, spread


@dataclass
class Callspec:
    params: dict[str, Any]


@dataclass
class Item:
    nodeid: str
    callspec: Callspec | None = None
    markers: set[str] = field(default_factory=set)

    def get_closest_marker(self, name: str):
        return name if name in self.markers else None


def _sweep(test: str, families: list[str], marked: set[str] = frozenset()) -> list[Item]:
    return [Item(f"{test}[{f}]", Callspec({"family": f}), {"exhaustive"} if f in marked else set()) for f in families]


FAMILIES = [f"fam{i:02d}" for i in range(40)]


def test_a_sweep_keeps_its_share_and_every_family_is_built_once() -> None:
    items = (_sweep("t.py::test_a", FAMILIES) + _sweep("t.py::test_b", FAMILIES)
             + [Item("t.py::test_plain"), Item("t.py::test_slow", markers={"exhaustive"})]
             + _sweep("t.py::test_small", FAMILIES[:SWEEP_MIN]))
    kept, deselected = quick_tier(items)
    names = {i.nodeid for i in kept}
    assert names | {i.nodeid for i in deselected} == {i.nodeid for i in items}
    assert not names & {i.nodeid for i in deselected}
    assert "t.py::test_plain" in names and "t.py::test_slow" not in names
    small = set(FAMILIES[:SWEEP_MIN])
    assert all(f"t.py::test_small[{f}]" in names for f in small)  # not a sweep: kept whole
    share = {t: {f for f in FAMILIES if f"t.py::{t}[{f}]" in names} for t in ("test_a", "test_b")}
    spreads = {t: spread(FAMILIES, f"t.py::{t}") for t in share}
    assert all(len(spreads[t]) == PER_SWEEP and share[t] >= spreads[t] for t in share)
    # the families no kept case touches are added once each, to the sweep keeping fewer cases; no other is added
    untouched = set(FAMILIES) - small - spreads["test_a"] - spreads["test_b"]
    added = [f for t in share for f in share[t] - spreads[t]]
    assert sorted(added) == sorted(untouched)
    assert abs(len(share["test_a"]) - len(share["test_b"])) <= 1


def test_random_collections_keep_the_rule() -> None:
    """Brute force over random collections: the rule re-stated independently, then compared."""
    rng = random.Random(0)
    for _ in range(200):
        items: list[Item] = []
        for t in range(rng.randint(0, 5)):
            fams = rng.sample(FAMILIES, rng.randint(1, 20))
            items += _sweep(f"m.py::test_{t}", fams, marked=set(rng.sample(fams, min(len(fams), rng.randint(0, 2)))))
        items += [Item(f"m.py::test_plain{k}", markers={"exhaustive"} if rng.random() < 0.3 else set())
                  for k in range(rng.randint(0, 3))]
        rng.shuffle(items)
        kept, _ = quick_tier(items)
        names = {i.nodeid for i in kept}
        assert [i for i in items if i.nodeid in names] == kept  # collection order kept
        assert not any(i.markers for i in kept)  # a marked test never runs in the quick tier
        by_test: dict[str, list[Item]] = {}
        for i in items:
            by_test.setdefault(i.nodeid.split("[")[0], []).append(i)
        for test, cases in by_test.items():
            fams = {family_of(i) for i in cases}
            runnable = [i for i in cases if not i.markers]
            if None in fams or len(fams) <= SWEEP_MIN:  # not a sweep: every unmarked case
                assert all(i.nodeid in names for i in runnable)
            else:
                assert {family_of(i) for i in runnable} & spread(list(dict.fromkeys(
                    family_of(i) for i in cases)), test) <= {family_of(i) for i in kept if i.nodeid.startswith(test)}
        reachable = {family_of(i) for i in items if family_of(i) and not i.markers}
        assert {family_of(i) for i in kept if family_of(i)} == reachable


@pytest.mark.exhaustive
def test_the_quick_tier_of_this_suite_builds_every_family_the_suite_builds() -> None:
    """pytest's own collection of tests/ in both tiers: the quick one is a subset touching every family."""
    def collect(*extra: str) -> list[str]:
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                               *extra, "tests"], cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        return [line for line in done.stdout.splitlines() if "::" in line]

    def families(ids: list[str]) -> set[str]:
        return {part for i in ids if "[" in i for part in i.rsplit("[", 1)[1].rstrip("]").split("-")}

    everything, quick, marked = collect("--exhaustive"), collect(), collect("--exhaustive", "-m", "exhaustive")
    assert set(quick) < set(everything)
    assert marked and not set(marked) & set(quick)  # a test marked exhaustive never runs in the quick tier
    from lightprune.models import supported_model_types

    built = families(everything) & set(supported_model_types())
    assert built and built <= families(quick)

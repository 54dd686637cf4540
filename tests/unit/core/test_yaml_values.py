"""lightprune's YAML loader reads values as jsonargparse's loader does (YAML 1.2 floats such as ``5e-1``, dates as
text), so the command's first pass and its parser agree on a value; a line the command prints cuts a long value."""

from __future__ import annotations

import math

import pytest

from lightprune.core.jsonio import clip, clip_values
from lightprune.core.strict_yaml import parse_yaml

#: plain scalars whose YAML 1.1 and YAML 1.2 readings differ, and their neighbours
SCALARS = ["5e-1", "1e-300", "-2E3", "+1e3", "1e5", "2.5e-1", "2.5e1", "0.5", ".5", "-.5", "1_000", "0x1f", "1:30",
           ".inf", "-.inf", ".nan", "2024-01-01", "2024-02-30", "1e", "e5", "1.0.0", "yes", "null"]


def _same(a, b) -> bool:
    return (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)) or \
        (type(a) is type(b) and a == b)


@pytest.mark.parametrize("text", SCALARS)
def test_a_scalar_reads_as_jsonargparse_reads_it(text: str) -> None:
    from jsonargparse._loaders_dumpers import yaml_load  # jsonargparse's own YAML loader (what a config goes through)

    for source in (text, f"ratio: {text}"):
        ours, theirs = parse_yaml(source, "x"), yaml_load(source)
        assert _same(ours, theirs) if source == text else _same(ours["ratio"], theirs["ratio"]), (source, ours, theirs)


def test_yaml_1_2_floats_are_floats_and_dates_text() -> None:
    assert parse_yaml("{a: 5e-1, b: 1e-300, c: 1E5, d: 2.5e1, e: 2024-01-01}", "x") == \
        {"a": 0.5, "b": 1e-300, "c": 100000.0, "d": 25.0, "e": "2024-01-01"}
    assert parse_yaml("2024-02-30", "x") == "2024-02-30"  # an impossible date: text, as jsonargparse reads it


def test_clip_says_how_much_it_cut() -> None:
    assert clip("a" * 200) == "a" * 200
    assert clip("a" * 1_000_000) == "a" * 200 + "… (999800 more characters)"
    line = "lightprune: error: x.yaml: ExpertPruning: unknown criterion '" + "a" * 1_000_000 + "'; available: aimer"
    assert clip_values(line) == ("lightprune: error: x.yaml: ExpertPruning: unknown criterion '" + "a" * 199 +
                                 "… (999801 more characters)'; available: aimer")  # the closing quote kept
    assert clip_values("short line, 'normal' values") == "short line, 'normal' values"
    spaced = "x " * 2000
    assert clip_values(spaced) == spaced[:2000] + "… (2000 more characters)"

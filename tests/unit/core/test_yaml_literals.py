"""Literals that YAML 1.1 (jsonargparse's loader) reads otherwise than YAML 1.2 or JSON: lightprune reads each one as
jsonargparse does (a config's value, a command-line value), and :func:`yaml_1_1_reading` names the ones to refuse."""

from __future__ import annotations

import pytest

from lightprune.core.strict_yaml import parse_yaml
from lightprune.core.yaml_literals import parse_value, yaml_1_1_reading, yaml_scalars

#: literal -> what YAML 1.1 reads it as (jsonargparse's loader), and the kind :func:`yaml_1_1_reading` gives (None:
#: YAML 1.2 or JSON reads it the same way, or as a user of either would write it)
LITERALS = {
    "020": (16, "octal"), "-020": (-16, "octal"), "0_20": (16, "octal"), "08": ("08", "octal"), "00": (0, None),
    "0o20": ("0o20", "0o"), "0x10": (16, None), "0b101": (5, None), "1_000": (1000, None), "+5": (5, None),
    "0020.5": (20.5, None), ":30": (":30", None), "1:30": (90, "base 60"), "1:30.5": (90.5, "base 60"),
    "yes": (True, "bool"), "no": (False, "bool"), "on": (True, "bool"), "off": (False, "bool"), "On": (True, "bool"),
    "true": (True, None), "y": ("y", None), "20": (20, None), "5e-1": (0.5, None),
}


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("text", list(LITERALS))
def test_a_literal_reads_as_jsonargparse_reads_it_and_the_1_1_readings_are_named(text: str) -> None:
    from jsonargparse._common import parser_context
    from jsonargparse._loaders_dumpers import load_value, yaml_load  # what a config / a command-line value goes through

    read, kind = LITERALS[text]
    config = f"tiny_overrides:\n  num_experts: {text}\n"
    assert _same(yaml_load(config)["tiny_overrides"]["num_experts"], read)  # the table is jsonargparse's reading
    assert _same(parse_yaml(config, "x")["tiny_overrides"]["num_experts"], read)
    with parser_context(load_value_mode="yaml"):
        assert _same(parse_value(text, "x"), load_value(text, simple_types=True))
    [scalar] = [s for s in yaml_scalars(config, "x") if not s.key and s.path == ("tiny_overrides", "num_experts")]
    assert scalar.plain and scalar.line == 2 and scalar.text == text and _same(scalar.value, read)
    reading = yaml_1_1_reading(text, read)
    assert (reading and reading[0]) == kind
    if reading:  # both readings in the words
        assert reading[1].startswith(f"{text} is read as ")


def test_the_1_1_readings_say_both_and_what_to_write() -> None:
    assert yaml_1_1_reading("020", 16)[1] == "020 is read as 16 (YAML 1.1 octal), not 20: write 20 (or 16, if octal " \
                                             "020 was meant)"
    assert yaml_1_1_reading("0o20", "0o20")[1] == ("0o20 is read as the text '0o20' (YAML 1.1 has no 0o prefix), not "
                                                   "16 (YAML 1.2 octal): write 16, or quote it ('0o20') for text")
    assert yaml_1_1_reading("1:30", 90)[1] == ("1:30 is read as 90 (YAML 1.1 base 60), not the text '1:30': write "
                                               "90, or quote it ('1:30') for text")
    assert yaml_1_1_reading("off", False)[1] == ("off is read as false (YAML 1.1 boolean), not the text 'off': write "
                                                 "false for the boolean, or quote it ('off') for text")
    # a command-line value: jsonargparse reads decimal digits first, as YAML 1.2 would
    assert parse_value("020", "x") == 20 and yaml_1_1_reading("020", 20) is None


def test_quoted_and_tagged_scalars_are_not_plain_and_every_node_is_visited_once() -> None:
    text = "a: '020'\nb: !!str yes\nc: &x [off, 1]\nd: *x\ne:\n  - \n"
    scalars = yaml_scalars(text, "x")
    plain = {(s.path, s.text): s.plain for s in scalars if not s.key}
    assert plain == {(("a",), "020"): False, (("b",), "yes"): False, (("c", 0), "off"): True, (("c", 1), "1"): True,
                     (("e", 0), ""): True}
    assert [s.line for s in scalars if s.path == ("e", 0)] == [6]

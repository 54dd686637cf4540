"""JSON and YAML past the readers' bounds (nesting depth, YAML aliases expanded) are refused quickly, naming the file
and the limit, by every reader of a user's file and by the command line before jsonargparse sees them."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from pathlib import Path

import pytest
import yaml
from fixtures import REPO

import lightprune as lp
from lightprune.core.errors import PlanError
from lightprune.core.jsonio import parse_json, read_json, read_yaml
from lightprune.core.parse_limits import MAX_DEPTH, MAX_YAML_VALUES, ParseLimitError, check_json_depth
from lightprune.core.strict_yaml import check_yaml_keys, check_yaml_limits, parse_yaml

SEE = "no file lightprune reads comes near that: check that it is the file meant"
YAML_READERS = (parse_yaml, check_yaml_keys, check_yaml_limits)


def billion_laughs(flow: bool = False) -> str:
    """Ten values, each of the nine next ten aliases of the one before: 10**10 values in under 700 bytes."""
    parts = [f"&l0 [{', '.join(['lol'] * 10)}]"] + [f"&l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]
    return "[" + ", ".join(parts) + "]" if flow else "".join(f"lol{i}: {part}\n" for i, part in enumerate(parts))


def aliases_message(where: str, line: int) -> str:
    return (f"{where}: YAML aliases expand the value at line {line} to more than {MAX_YAML_VALUES} values "
            f"(limit {MAX_YAML_VALUES}); {SEE}")


def deep_yaml_message(where: str, line: int, aliases: bool = False) -> str:
    through = " through its aliases" if aliases else ""
    return f"{where}: YAML nested more than {MAX_DEPTH} levels deep{through} at line {line} (limit {MAX_DEPTH}); {SEE}"


def deep_json_message(where: str, depth: int) -> str:
    return f"{where}: JSON nested {depth} levels deep (limit {MAX_DEPTH}); {SEE}"


@contextlib.contextmanager
def deadline(seconds: float):
    """Fail (TimeoutError) instead of hanging when the block takes longer than ``seconds``."""
    def expire(signum, frame):
        raise TimeoutError(f"took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_the_deadline_fails_a_block_that_hangs() -> None:
    with pytest.raises(TimeoutError), deadline(0.2):
        while True:
            pass


# --- YAML: aliases -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flow", [False, True], ids=["block", "flow"])
def test_billion_laughs_is_refused_quickly_naming_where_and_the_limit(flow: bool) -> None:
    text = billion_laughs(flow)
    assert len(text) < 700
    for read in YAML_READERS:
        with deadline(5), pytest.raises(ParseLimitError) as info:
            read(text, "config file 'bomb.yaml'")
        assert str(info.value) == aliases_message("config file 'bomb.yaml'", 1 if flow else 6)
        assert isinstance(info.value, ValueError)


def test_the_expanded_size_is_counted_to_the_value_at_the_limit() -> None:
    """999 uses of one anchored list of 1000 values and the list holding them: exactly the limit, accepted; one
    value more, refused."""
    anchored = "- &a [" + ", ".join(["0"] * 1000) + "]\n"
    text = anchored + "- *a\n" * 998
    assert 1 + 999 * 1001 == MAX_YAML_VALUES
    for read in YAML_READERS:
        with deadline(10):
            read(text, "x")
    assert parse_yaml(text, "x") == [[0] * 1000] * 999
    for read in YAML_READERS:
        with deadline(10), pytest.raises(ParseLimitError) as info:
            read(text + "- 0\n", "config file 'c.yaml'")
        assert str(info.value) == aliases_message("config file 'c.yaml'", 1)


def test_a_config_using_an_anchor_a_few_times_is_read_as_safe_load_reads_it() -> None:
    text = (REPO / "configs" / "aimer_tiny.yaml").read_text().replace(
        "  callbacks:\n", "  callbacks: &callbacks\n") + (
        "common: &common {criterion: aimer, ratio: 0.5, allocation: uniform}\n"
        "variants:\n  - {<<: *common, ratio: 0.25}\n  - {<<: *common, ratio: 0.75}\n  - *common\n"
        "again: *callbacks\n")
    value = parse_yaml(text, "x")
    assert value == yaml.safe_load(text)
    assert value["variants"][0] == {"criterion": "aimer", "ratio": 0.25, "allocation": "uniform"}
    assert value["again"] == value["trainer"]["callbacks"]
    check_yaml_keys(text, "x")
    check_yaml_limits(text, "x")


def test_an_alias_inside_the_value_it_names_is_refused() -> None:
    for read in YAML_READERS:
        with pytest.raises(ParseLimitError) as info:
            read("a: 1\nb: &b\n  c: [1, *b]\n", "config file 'c.yaml'")
        assert str(info.value) == ("config file 'c.yaml': the YAML value anchored at line 2 holds an alias to itself, "
                                   f"which expands without end (limit {MAX_YAML_VALUES} values); remove the alias")


# --- YAML: depth ---------------------------------------------------------------------------------------------------

def _block(depth: int) -> str:
    """``depth`` mappings, one inside the other."""
    return "".join("  " * i + "a:\n" for i in range(depth - 1)) + "  " * (depth - 1) + "a: 1\n"


@pytest.mark.parametrize(("make", "line"), [(lambda n: "[" * n + "]" * n, 1), (lambda n: "- " * n + "x", 1),
                                            (_block, MAX_DEPTH + 1)], ids=["flow", "block_sequence", "block_mapping"])
def test_yaml_nested_to_the_limit_is_read_and_past_it_refused(make, line) -> None:
    at, past = make(MAX_DEPTH), make(MAX_DEPTH + 1)
    assert parse_yaml(at, "x") == yaml.safe_load(at)
    for read in YAML_READERS:
        read(at, "x")
        with deadline(5), pytest.raises(ParseLimitError) as info:
            read(past, "config file 'c.yaml'")
        assert str(info.value) == deep_yaml_message("config file 'c.yaml'", line)


@pytest.mark.parametrize(("make", "depth"), [(lambda n: "[" * n + "]" * n, 100_000), (lambda n: "- " * n + "x", 100_000),
                                             (_block, 2000)], ids=["flow", "block_sequence", "block_mapping"])
def test_yaml_nested_deeper_than_python_recurses_is_refused_not_a_recursion_error(make, depth: int) -> None:
    """(A block mapping 100,000 deep is 10 GB of indentation: 2000 is past PyYAML's recursion already.)"""
    text = make(depth)
    for read in YAML_READERS:
        with deadline(10), pytest.raises(ParseLimitError, match=r"YAML nested more than 100 levels deep at line \d+ "
                                                                 r"\(limit 100\)"):
            read(text, "config file 'c.yaml'")


def test_yaml_nested_past_the_limit_through_its_aliases_is_refused() -> None:
    inner = "[" * 60 + "]" * 60
    at = f"x: &x {inner}\ny: " + "[" * 39 + "*x" + "]" * 39 + "\n"  # the mapping, 39 lists, x's 60
    past = f"x: &x {inner}\ny: " + "[" * 40 + "*x" + "]" * 40 + "\n"
    assert parse_yaml(at, "x") == yaml.safe_load(at)
    for read in YAML_READERS:
        with pytest.raises(ParseLimitError) as info:
            read(past, "config file 'c.yaml'")
        assert str(info.value) == deep_yaml_message("config file 'c.yaml'", 1, aliases=True)


def test_read_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(billion_laughs())
    with deadline(5), pytest.raises(PlanError) as info:
        read_yaml(path, "config", PlanError)
    assert str(info.value) == aliases_message(f"config file {str(path)!r}", 6)


# --- JSON ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [lambda n: "[" * n + "]" * n, lambda n: '{"a": ' * n + "1" + "}" * n,
                                  lambda n: '{"a": [' * (n // 2) + "{}" * (n % 2) + "]}" * (n // 2)],
                         ids=["arrays", "objects", "both"])
def test_json_nested_to_the_limit_is_read_and_past_it_refused(make) -> None:
    at, past = make(MAX_DEPTH), make(MAX_DEPTH + 1)
    assert parse_json(at, "x") == json.loads(at)
    assert parse_json(at.encode(), "x") == json.loads(at)
    for text in (past, past.encode(), past.encode("utf-16")):
        with pytest.raises(ParseLimitError) as info:
            parse_json(text, "plan file 'p.json'")
        assert str(info.value) == deep_json_message("plan file 'p.json'", MAX_DEPTH + 1)


def test_brackets_inside_strings_do_not_count() -> None:
    noise = ['"[[[[{{{{"', r'"\"[[[[\""', r'"\\"', r'"\\\"[[[["', '"]]]]}}}}"', '""', r'"\\\\"']
    inner = "[" * (MAX_DEPTH - 1) + ", ".join(noise) + "]" * (MAX_DEPTH - 1)
    at = '{"k[[\\"[[": ' + inner + ', "[": "{{{{"}'
    assert parse_json(at, "x") == json.loads(at)
    past = '{"k[[\\"[[": [' + inner + '], "[": "{{{{"}'
    with pytest.raises(ParseLimitError) as info:
        parse_json(past, "x")
    assert str(info.value) == deep_json_message("x", MAX_DEPTH + 1)
    check_json_depth('["' + "[" * 100_000 + '"]', "x")  # one string
    with pytest.raises(json.JSONDecodeError):  # not JSON: left to the parser
        parse_json('["' + "[" * 50 + '"', "x")


def test_json_nested_100000_deep_is_refused_naming_the_depth_found() -> None:
    with deadline(5), pytest.raises(ParseLimitError) as info:
        parse_json("[" * 100_000 + "]" * 100_000, "report 'r.json'")
    assert str(info.value) == deep_json_message("report 'r.json'", 100_000)


def test_a_plan_nested_100000_deep_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text('{"keep": {"0": ' + "[" * 100_000 + "]" * 100_000 + '}, "num_experts": {"0": 4}}')
    for load in (lp.ExpertPlan.load, lambda p: read_json(p, "plan", PlanError)):
        with deadline(5), pytest.raises(PlanError) as info:
            load(path)
        assert str(info.value) == deep_json_message(f"plan file {str(path)!r}", 100_002)


# --- the readers ---------------------------------------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


def test_jsonl_rows_name_the_file_and_line(tmp_path: Path) -> None:
    from lightprune.data.rows import JsonlRowError, read_jsonl

    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "a"}\n{"text": ' + DEEP + "}\n")
    with pytest.raises(JsonlRowError) as info:
        read_jsonl(path)
    assert str(info.value) == deep_json_message(f"{path}:2", 100_001)


def test_tokenizer_file(tmp_path: Path) -> None:
    from lightprune.data.text import check_tokenizer_dir

    (tmp_path / "tokenizer.json").write_text('{"model": ' + DEEP + "}")
    with pytest.raises(ParseLimitError) as info:
        check_tokenizer_dir(tmp_path, "tokenizer")
    assert str(info.value) == deep_json_message(f"tokenizer file {str(tmp_path / 'tokenizer.json')!r}", 100_001)


def test_export_manifests(tmp_path: Path) -> None:
    from lightprune.export.result import MANIFEST_FILE, record_evaluation
    from lightprune.export.width_format import read_width_manifest

    (tmp_path / MANIFEST_FILE).write_text('{"format": ' + DEEP + "}")
    before = (tmp_path / MANIFEST_FILE).read_text()
    with pytest.raises(ParseLimitError) as info:
        record_evaluation(tmp_path, {"after": {}})
    assert str(info.value) == deep_json_message(f"export manifest file {str(tmp_path / MANIFEST_FILE)!r}", 100_001)
    assert (tmp_path / MANIFEST_FILE).read_text() == before
    with pytest.raises(ParseLimitError) as info:
        read_width_manifest(tmp_path)
    assert str(info.value) == deep_json_message(f"width manifest file {str(tmp_path / MANIFEST_FILE)!r}", 100_001)


def test_cache_manifest(tmp_path: Path) -> None:
    from lightprune.data.cache import MANIFEST, CacheError, check_folder

    (tmp_path / MANIFEST).write_text('{"files": ' + DEEP + "}")
    with pytest.raises(CacheError) as info:
        check_folder(tmp_path, {}, ())
    assert str(info.value) == deep_json_message(str(tmp_path / MANIFEST), 100_001)


def test_report_files(tmp_path: Path) -> None:
    from lightprune.reporting.report import merge_report

    path = tmp_path / "report.json"
    path.write_text(DEEP)
    with pytest.raises(ParseLimitError) as info:
        merge_report({"x": 1}, path)
    assert str(info.value) == deep_json_message(str(path), 100_000)
    assert path.read_text() == DEEP  # left as it is


def test_lm_eval_task_file(tmp_path: Path) -> None:
    from lightprune.callbacks.evaluate import load_lm_eval_task

    path = tmp_path / "task.yaml"
    path.write_text(billion_laughs())
    with deadline(5), pytest.raises(ParseLimitError) as info:
        load_lm_eval_task(path)
    assert str(info.value) == aliases_message(f"lm_eval task file {str(path)!r}", 6)


# --- the command line and run_recipe -------------------------------------------------------------------------------

@pytest.fixture()
def bomb(tmp_path: Path) -> Path:
    path = tmp_path / "bomb.yaml"
    path.write_text((REPO / "configs" / "aimer_tiny.yaml").read_text() + billion_laughs())
    return path


def _bomb_line(path: Path) -> int:
    """The line of the first value past the limit: ``lol5``, 1 + 10 * 111111 values."""
    lines = path.read_text().splitlines()
    return lines.index(next(line for line in lines if line.startswith("lol5:"))) + 1


def _command(argv: list[str], monkeypatch, capsys) -> str:
    from lightprune.cli import command

    monkeypatch.setattr(sys, "argv", ["lightprune", *argv])
    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    with deadline(10), pytest.raises(SystemExit) as info:
        command.main()
    assert info.value.code == 2
    return capsys.readouterr().err


def test_the_command_refuses_a_bomb_config_in_one_line(bomb: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    run = tmp_path / "run"
    err = _command(["calibrate", "--config", str(bomb), "--trainer.default_root_dir", str(run)], monkeypatch, capsys)
    assert err == f"lightprune: error: {aliases_message(f'config file {str(bomb)!r}', _bomb_line(bomb))}\n"
    assert not run.exists()
    err = _command(["export", f"--config={bomb}"], monkeypatch, capsys)
    assert err == f"lightprune: error: {aliases_message(f'config file {str(bomb)!r}', _bomb_line(bomb))}\n"


def test_the_command_refuses_a_bomb_given_inline_or_as_an_option_value(monkeypatch, capsys) -> None:
    config = str(REPO / "configs" / "aimer_tiny.yaml")
    cases = [
        (["export", "--config", billion_laughs()], aliases_message("--config", 6)),
        (["export", "--config", config, "--trainer.callbacks+=" + billion_laughs(flow=True)],
         aliases_message("--trainer.callbacks+", 1)),
        (["export", "--config", config, "--prune.ratio", billion_laughs(flow=True)], aliases_message("--prune.ratio", 1)),
        (["export", "--config", config, "--prune.ratio=" + billion_laughs()], aliases_message("--prune.ratio", 6)),
        (["export", "--config", config, "--model.init_args.tiny_overrides", "[" * 101 + "]" * 101],
         deep_yaml_message("--model.init_args.tiny_overrides", 1)),
    ]
    for argv, message in cases:
        assert _command(argv, monkeypatch, capsys) == f"lightprune: error: {message}\n"


def test_check_command_line_refuses_it_and_takes_a_config_using_anchors(bomb: Path, tmp_path: Path) -> None:
    from lightprune.cli.command_line_checks import check_command_line
    from lightprune.cli.options import OptionError

    with deadline(10), pytest.raises(OptionError) as info:
        check_command_line(["calibrate", "--config", str(bomb)])
    assert str(info.value) == aliases_message(f"config file {str(bomb)!r}", _bomb_line(bomb))
    anchors = tmp_path / "anchors.yaml"
    text = (REPO / "configs" / "aimer_tiny.yaml").read_text()
    anchors.write_text(text.replace("  devices: 1\n", "  devices: &one 1\n  num_nodes: *one\n  max_epochs: *one\n"))
    assert anchors.read_text() != text
    check_command_line(["export", "--config", str(anchors), "--trainer.default_root_dir", str(tmp_path / "run")])


def test_the_parser_refuses_a_bomb_before_it_builds_it(bomb: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """What jsonargparse reads (``python -m lightprune.cli``, torchrun: no first pass) is refused alike."""
    import jsonargparse

    from lightprune.cli import app, parser_settings

    monkeypatch.setattr(sys, "argv", ["lightprune", "calibrate", "--config", str(bomb)])
    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    with deadline(60), pytest.raises(SystemExit) as info:
        app.main()
    assert info.value.code == 2
    assert capsys.readouterr().err == (
        f"lightprune: error: {aliases_message(f'config file {str(bomb)!r}', _bomb_line(bomb))}\n")
    parser_settings.refuse_duplicate_yaml_keys()
    with deadline(5), pytest.raises(ParseLimitError) as limit:
        jsonargparse.get_loader("yaml")("[" * 101 + "]" * 101)
    assert str(limit.value) == deep_yaml_message('value "' + "[" * 56 + "...", 1)


def test_run_recipe_raises_the_error(bomb: Path) -> None:
    from lightprune.cli.options import OptionError

    with deadline(10), pytest.raises(ParseLimitError) as info:
        lp.run_recipe(bomb)
    assert str(info.value) == aliases_message(f"recipe {str(bomb)!r}", _bomb_line(bomb))
    with deadline(10), pytest.raises(OptionError) as option:
        lp.run_recipe(REPO / "configs" / "aimer_tiny.yaml", overrides={"prune.ratio": billion_laughs()})
    assert str(option.value) == aliases_message("--prune.ratio", 6)


LONG = "9" * 5000  # over Python's int-string limit (4300 digits)


def digits_message(where: str, key: str, line: int | None = None) -> str:
    at = f" at line {line}" if line else ""
    return (f"{where}: {key} is an integer of 5000 digits{at} (limit {sys.get_int_max_str_digits()} digits); no "
            "number lightprune reads comes near that: check that it is the value meant")


def test_an_integer_past_pythons_digit_limit_names_the_file_and_the_key(tmp_path: Path) -> None:
    """Python's "Exceeds the limit (4300 digits) ... use sys.set_int_max_str_digits()" named nothing: the readers
    name the file, the key (JSON: its path; YAML: its path and line)."""
    assert sys.get_int_max_str_digits() == 4300
    with pytest.raises(ParseLimitError) as info:
        parse_json('{"keep": {"0": [0, 1, ' + LONG + ']}}', "plan file 'p.json'")
    assert str(info.value) == digits_message("plan file 'p.json'", "keep['0'][2]")
    config = tmp_path / "config.json"
    config.write_text('{"hidden_size": 32, "max_position_embeddings": -' + LONG + '}')
    with pytest.raises(ValueError) as info:
        read_json(config, "config.json")
    assert str(info.value) == digits_message(f"config.json file {str(config)!r}", "max_position_embeddings")
    for reader in YAML_READERS:  # also the check the parser's own YAML loader runs (lightprune.cli.parser_settings)
        with pytest.raises(ParseLimitError) as info:
            reader("trainer:\n  max_steps: 3\nseed_everything: " + LONG + "\n", "config file 'c.yaml'")
        assert str(info.value) == digits_message("config file 'c.yaml'", "seed_everything", 3)
    assert parse_json("[" + "9" * 4300 + "]", "x") == [int("9" * 4300)]  # at the limit: read


def test_a_file_or_key_named_digits_is_not_taken_for_a_long_integer(tmp_path: Path) -> None:
    """Any ValueError whose text held "digits" was reported as an over-long integer: a key named twice in
    ``digits.json`` (or a key ``digits`` named twice) said "an integer of more than 4300 digits"; only Python's
    own digit-limit error is."""
    from lightprune.core.parse_limits import DuplicateKeyError

    with pytest.raises(DuplicateKeyError) as info:
        parse_json('{"a": 1, "a": 2}', "plan file digits.json")
    assert str(info.value) == "plan file digits.json: key 'a' appears twice in one JSON object (values 1 and 2); remove one"
    with pytest.raises(DuplicateKeyError) as info:
        parse_json('{"digits": 1, "digits": [3]}', "x")
    assert str(info.value) == "x: key 'digits' appears twice in one JSON object (values 1 and [3]); remove one"
    path = tmp_path / "digits.json"
    path.write_text('{"keep": {"0": [0]}, "keep": {}}')
    with pytest.raises(ValueError) as info:
        read_json(path, "plan")
    assert type(info.value) is DuplicateKeyError
    assert str(info.value) == (f"plan file {str(path)!r}: key 'keep' appears twice in one JSON object (values "
                               '{"0": [0]} and {}); remove one')
    with pytest.raises(json.JSONDecodeError):  # not JSON: as json.loads says it
        parse_json('{"digits": }', "plan file digits.json")


def test_a_layer_key_past_the_digit_limit_is_no_layer(tmp_path: Path) -> None:
    from lightprune.core.jsonio import int_key

    assert int_key("1" * 5000) is None
    plan = {"keep": {"0": [0, 1], "1" * 5000: [0, 1]}, "num_experts": {"0": 4, "1" * 5000: 4}, "criterion": "aimer",
            "ratio": 0.5, "allocation": "uniform", "metadata": {}}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    with pytest.raises(PlanError) as info:
        lp.ExpertPlan.load(path)
    assert str(info.value) == (f"plan file {str(path)!r}: layer key '{'1' * 40}… (4960 more characters)' in keep is "
                               "a number of 5000 digits: no model has such a layer")

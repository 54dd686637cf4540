"""JSON and YAML naming one key twice are refused, naming the key and the file, by every reader of a user's file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from fixtures import REPO

import lightprune as lp
from lightprune.core.errors import PlanError
from lightprune.core.jsonio import parse_json, read_json, read_yaml
from lightprune.core.parse_limits import DuplicateKeyError
from lightprune.core.strict_yaml import check_yaml_keys, parse_yaml

PLAN = '{"keep": {"0": [0, 1]}, "num_experts": {"0": 4}, "keep": {"0": [2, 3]}}'
TWO_TRAINERS = "trainer:\n  max_steps: 1\nmodel:\n  x: 1\ntrainer:\n  max_steps: 2\n"


# --- JSON ----------------------------------------------------------------------------------------------------------

def test_parse_json_refuses_a_key_given_twice_naming_where_the_key_and_both_values() -> None:
    with pytest.raises(DuplicateKeyError) as info:
        parse_json('{"a": {"b": 1, "b": [2]}}', "plan file 'p.json'")
    assert str(info.value) == ("plan file 'p.json': key 'b' appears twice in one JSON object (values 1 and [2]); "
                               "remove one")
    assert isinstance(info.value, ValueError)


def test_parse_json_reads_json_without_repeated_keys_as_json_loads_does() -> None:
    text = '{"a": [1, {"b": null, "c": true}], "d": 1.5, "e": {"a": 2}}'
    assert parse_json(text, "x") == json.loads(text)


def test_a_plan_file_naming_a_key_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(PLAN)
    with pytest.raises(PlanError) as info:
        lp.ExpertPlan.load(path)
    assert str(info.value) == (f"plan file {str(path)!r}: key 'keep' appears twice in one JSON object "
                               "(values {\"0\": [0, 1]} and {\"0\": [2, 3]}); remove one")


def test_read_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "scores.json"
    path.write_text('{"attn": {}, "ffn": {}, "ffn": {"0": 1}}')
    with pytest.raises(ValueError, match=f"^width score file '{path}': key 'ffn' appears twice"):
        read_json(path, "width score")


# --- YAML ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "message"), [
    (TWO_TRAINERS, "key 'trainer' appears twice in one mapping (lines 1 and 5)"),
    ("trainer:\n  logger: false\n  devices: 1\n  logger: true\n", "key 'logger' appears twice in one mapping (lines 2 and 4)"),
    ("callbacks:\n  - {ratio: 0.5, ratio: 0.3}\n", "key 'ratio' appears twice in one mapping (lines 2 and 2)"),
    ("{1: a, true: b}", "keys '1' and 'true' (one key) appear twice in one mapping (lines 1 and 1)"),
])
def test_parse_yaml_and_check_yaml_keys_refuse_a_key_given_twice(text: str, message: str) -> None:
    for read in (parse_yaml, check_yaml_keys):
        with pytest.raises(DuplicateKeyError) as info:
            read(text, "config file 'c.yaml'")
        assert str(info.value) == f"config file 'c.yaml': {message}; remove one"


def test_parse_yaml_reads_yaml_without_repeated_keys_as_safe_load_does() -> None:
    texts = [path.read_text() for path in sorted((REPO / "configs").glob("*.yaml"))]
    assert texts
    texts += ["0.5", "true", "null", "[1, 2]", "a string", "", "{a, b}", "base: &b {x: 1}\nd:\n  <<: *b\n  x: 2\n"]
    for text in texts:
        assert parse_yaml(text, "x") == yaml.safe_load(text)
    assert parse_yaml("base: &b {x: 1}\nd:\n  <<: *b\n  x: 2\n", "x")["d"] == {"x": 2}  # a merge key's override


def test_check_yaml_keys_builds_no_value() -> None:
    check_yaml_keys("day: 2024-13-45\nother: [1, {a: 1}]\n", "x")  # PyYAML cannot build that date
    with pytest.raises(yaml.YAMLError):
        check_yaml_keys("a: [1, 2\n", "x")


def test_read_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(TWO_TRAINERS)
    with pytest.raises(ValueError) as info:
        read_yaml(path, "config")
    assert str(info.value) == (f"config file {str(path)!r}: key 'trainer' appears twice in one mapping (lines 1 and 5); "
                               "remove one")
    path.write_text("a: [1\n")
    with pytest.raises(ValueError, match=f"^config file {str(path)!r} is not valid YAML"):
        read_yaml(path, "config")
    with pytest.raises(FileNotFoundError, match="config file '.*nope.yaml' does not exist"):
        read_yaml(tmp_path / "nope.yaml", "config")
    path.write_text("a: 1\n")
    assert read_yaml(path, "config") == {"a": 1}


def test_core_imports_no_yaml() -> None:
    code = "import sys, lightprune.core.jsonio; print('yaml' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


# --- the readers ---------------------------------------------------------------------------------------------------

def test_recipe(tmp_path: Path) -> None:
    from lightprune.cli.recipe import recipe_command

    path = tmp_path / "r.yaml"
    path.write_text(TWO_TRAINERS)
    with pytest.raises(DuplicateKeyError, match=f"^recipe {str(path)!r}: key 'trainer' appears twice in one mapping "
                                                r"\(lines 1 and 5\)"):
        recipe_command(str(path))


def test_lm_eval_task_file(tmp_path: Path) -> None:
    from lightprune.callbacks.evaluate import load_lm_eval_task

    path = tmp_path / "task.yaml"
    path.write_text("task: a\ndataset_path: json\ntask: b\n")
    with pytest.raises(DuplicateKeyError, match=f"^lm_eval task file {str(path)!r}: key 'task' appears twice in one "
                                                r"mapping \(lines 1 and 3\)"):
        load_lm_eval_task(path)


def test_jsonl_rows_name_the_file_and_line(tmp_path: Path) -> None:
    from lightprune.data.rows import JsonlRowError, read_jsonl

    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "a"}\n\n{"text": "b", "text": "c"}\n')
    with pytest.raises(JsonlRowError) as info:
        read_jsonl(path)
    assert str(info.value) == f'{path}:3: key \'text\' appears twice in one JSON object (values "b" and "c"); remove one'


def test_image_text_task_scan_leaves_the_row_to_the_reader(tmp_path: Path) -> None:
    from lightprune.data.image_text import _file_tasks

    path = tmp_path / "train.jsonl"
    path.write_text('{"task": "count"}\n{"task": "color", "task": "shape"}\n')
    assert _file_tasks(path, None) == ({"count"}, True)


def test_tokenizer_file(tmp_path: Path) -> None:
    from lightprune.data.text import check_tokenizer_dir

    (tmp_path / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0, "a": 1}}}')
    with pytest.raises(DuplicateKeyError, match=f"^tokenizer file {str(tmp_path / 'tokenizer.json')!r}: key 'a' "
                                                "appears twice in one JSON object"):
        check_tokenizer_dir(tmp_path, "tokenizer")


def test_generated_qa_rows_and_manifest(tmp_path: Path) -> None:
    from lightprune.data.generated.qa import GeneratedQADataModule

    module = SimpleNamespace(folder=tmp_path)
    (tmp_path / "val.jsonl").write_text('{"task": "count"}\n{"answer": "1", "answer": "2"}\n')
    with pytest.raises(DuplicateKeyError, match=f"^{tmp_path / 'val.jsonl'}:2: key 'answer' appears twice"):
        GeneratedQADataModule.rows(module, "val")
    (tmp_path / "manifest.json").write_text('{"rows": 1, "rows": 2}')
    with pytest.raises(DuplicateKeyError, match=f"^{tmp_path / 'manifest.json'}: key 'rows' appears twice"):
        GeneratedQADataModule.manifest.fget(module)


def test_export_config_and_source_json_files(tmp_path: Path) -> None:
    from lightprune.export.config_file import finish_config
    from lightprune.export.tokenizer_files import _copy_dropping_auto_map

    (tmp_path / "config.json").write_text('{"model_type": "a", "model_type": "b"}')
    with pytest.raises(DuplicateKeyError, match=f"^config file {str(tmp_path / 'config.json')!r}: key 'model_type' "
                                                "appears twice in one JSON object"):
        finish_config(tmp_path, None, True)
    src = tmp_path / "generation_config.json"
    src.write_text('{"auto_map": {}, "eos_token_id": 1, "eos_token_id": 2}')
    with pytest.raises(DuplicateKeyError, match=f"^source file {str(src)!r}: key 'eos_token_id' appears twice"):
        _copy_dropping_auto_map(src, tmp_path / "copy.json")
    assert not (tmp_path / "copy.json").exists()


def test_width_manifest(tmp_path: Path) -> None:
    from lightprune.export.result import MANIFEST_FILE
    from lightprune.export.width_format import read_width_manifest

    (tmp_path / MANIFEST_FILE).write_text('{"align": 64, "align": 128}')
    with pytest.raises(DuplicateKeyError, match=f"^width manifest file {str(tmp_path / MANIFEST_FILE)!r}: key 'align' "
                                                "appears twice"):
        read_width_manifest(tmp_path)


def test_report_files(tmp_path: Path) -> None:
    from lightprune.reporting.page import write_report_page
    from lightprune.reporting.report import merge_report

    path = tmp_path / "report.json"
    path.write_text('{"ratio": 0.5, "ratio": 0.25}')
    with pytest.raises(DuplicateKeyError, match=f"^{path}: key 'ratio' appears twice"):
        merge_report({"x": 1}, path)
    assert path.read_text() == '{"ratio": 0.5, "ratio": 0.25}'  # left as it is
    with pytest.raises(DuplicateKeyError, match=f"^{path}: key 'ratio' appears twice"):
        write_report_page(tmp_path)
    assert not (tmp_path / "report.md").exists()


def test_testbed_training_record(tmp_path: Path) -> None:
    from lightprune.quality.tables import _testbed_record

    (tmp_path / "training.json").write_text('{"parameters": 1, "parameters": 2}')
    with pytest.raises(ValueError, match=f"^testbed training file {str(tmp_path / 'training.json')!r}: key "
                                         "'parameters' appears twice"):
        _testbed_record(tmp_path, "micro", "held_out_perplexity")

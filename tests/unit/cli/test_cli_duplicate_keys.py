"""A config naming one key twice (a second ``trainer:`` block, a repeated nested option) stops the command with one
``lightprune: error:`` line naming the key, the file and both lines; a config without one parses as before."""

from __future__ import annotations

import sys
from pathlib import Path

import jsonargparse
import pytest
import yaml
from fixtures import REPO

from lightprune.cli import app, command, parser_settings
from lightprune.core.parse_limits import DuplicateKeyError

CONFIG = REPO / "configs" / "aimer_tiny.yaml"


@pytest.fixture(autouse=True)
def _plain(monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["lightprune"])
    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)


@pytest.fixture()
def loaders():
    """(jsonargparse's own YAML loader, the command's); the command's is installed again afterwards."""
    parser_settings.refuse_duplicate_yaml_keys()
    strict = jsonargparse.get_loader("yaml")
    yield (lambda stream, path="": strict.original(stream)), strict
    jsonargparse.set_loader("yaml", strict, (yaml.YAMLError,))


def _line(lines: list[str], text: str, start: int = 0) -> int:
    return lines.index(text, start) + 1


def _two_trainers(tmp_path: Path) -> tuple[Path, int, int]:
    text = CONFIG.read_text() + "trainer:\n  accelerator: cpu\n  max_steps: 3\n"
    path = tmp_path / "two_trainers.yaml"
    path.write_text(text)
    lines = text.splitlines()
    first = _line(lines, "trainer:")
    return path, first, _line(lines, "trainer:", first)


def _repeated_logger(tmp_path: Path) -> tuple[Path, int, int]:
    text = CONFIG.read_text().replace("  devices: 1\n", "  logger: true\n  devices: 1\n")
    path = tmp_path / "logger.yaml"
    path.write_text(text)
    lines = text.splitlines()
    first = _line(lines, "  logger: true")
    return path, first, _line(lines, "  logger: false")


def _run(argv: list[str], main, monkeypatch, capsys) -> str:
    monkeypatch.setattr(sys, "argv", ["lightprune", *argv])
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("config", [_two_trainers, _repeated_logger])
@pytest.mark.parametrize("main", [app.main, command.main], ids=["cli", "console_script"])
def test_a_key_given_twice_in_a_config_is_one_error_line(config, main, tmp_path, monkeypatch, capsys) -> None:
    path, first, second = config(tmp_path)
    key = "trainer" if config is _two_trainers else "logger"
    err = _run(["export", "--config", str(path), "--trainer.default_root_dir", str(tmp_path / "run")], main,
               monkeypatch, capsys)
    assert err == (f"lightprune: error: config file {str(path)!r}: key {key!r} appears twice in one mapping "
                   f"(lines {first} and {second}); remove one\n")
    assert not (tmp_path / "run").exists()


def test_a_key_given_twice_in_an_option_value_is_one_error_line(tmp_path, monkeypatch, capsys) -> None:
    err = _run(["export", "--config", str(CONFIG), "--trainer.default_root_dir", str(tmp_path / "run"),
                "--model.init_args.tiny_overrides", "{num_hidden_layers: 2, num_hidden_layers: 3}"], app.main,
               monkeypatch, capsys)
    assert err == ("lightprune: error: value '{num_hidden_layers: 2, num_hidden_layers: 3}': key 'num_hidden_layers' "
                   "appears twice in one mapping (lines 1 and 1); remove one\n")
    err = _run(["export", "--config", str(CONFIG), "--prune.n_per_layer", "{a: 1, a: 2}"], command.main, monkeypatch,
               capsys)
    assert err == "lightprune: error: --prune.n_per_layer: key 'a' appears twice in one mapping (lines 1 and 1); remove one\n"


def test_cli_main_and_run_recipe_raise_the_error(tmp_path) -> None:
    import lightprune as lp

    path, first, second = _two_trainers(tmp_path)
    message = f"config file {str(path)!r}: key 'trainer' appears twice in one mapping \\(lines {first} and {second}\\)"
    with pytest.raises(DuplicateKeyError, match=message):
        app.cli_main(["export", "--config", str(path)])
    with pytest.raises(DuplicateKeyError, match=f"recipe {str(path)!r}: key 'trainer' appears twice"):
        lp.run_recipe(path)


def test_values_without_repeated_keys_load_as_before(loaders) -> None:
    original, strict = loaders
    texts = [path.read_text() for path in sorted((REPO / "configs").glob("*.yaml"))]
    texts += ["0.5", "true", "null", "[1, 2]", "{a: 1}", "a string", "{a, b}", "configs/aimer.yaml", "1e3", "2024-01-01",
              "lightprune.callbacks.Export", "{class_path: x, init_args: {ratio: 0.5}}", "- 1\n- 2\n", '{"a": [1]}']
    for text in texts:
        assert strict(text) == original(text), text


def test_a_config_without_repeated_keys_parses_to_the_same_values(loaders, monkeypatch, capsys) -> None:
    original, strict = loaders
    argv = ["export", "--config", str(CONFIG), "--model.init_args.tiny_overrides", "{num_hidden_layers: 2}",
            "--print_config"]
    printed = []
    for loader in (original, strict):
        jsonargparse.set_loader("yaml", loader, (yaml.YAMLError,))
        monkeypatch.setattr(app, "refuse_duplicate_yaml_keys", lambda: None)
        with pytest.raises(SystemExit) as info:
            app.cli_main(argv)
        assert info.value.code == 0
        printed.append(capsys.readouterr().out)
    assert printed[0] == printed[1] and "num_hidden_layers: 2" in printed[0] and "ratio: 0.5" in printed[0]

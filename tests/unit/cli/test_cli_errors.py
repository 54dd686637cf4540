"""The command's errors are one ``lightprune: error:`` line: bad option values, bad inputs, OS errors."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest
from fixtures import REPO

from lightprune.cli import app as cli
from lightprune.cli.errors import condense

UNION = '''Parser key "trainer.callbacks":
  Does not validate against any of the Union subtypes
  Errors:
    - Problem with given class_path 'lightprune.callbacks.ExpertPruning':
        Parser key "ratio":
          Does not validate against any of the Union subtypes
          Subtypes: [<class 'float'>, <class 'NoneType'>]
          Errors:
            - Expected a <class 'float'>
            - Expected a <class 'NoneType'>
          Given value type: <class 'str'>
          Given value: abc
    - Problem with given class_path 'lightning.Callback':
        Option 'ratio' is not accepted
  Given value: NestedArg(key='ratio', val='abc')'''


def test_condense_names_the_class_the_option_the_value_and_the_types() -> None:
    assert condense(UNION) == "ExpertPruning: ratio='abc' is not a float or null"
    assert condense("Unrecognized arguments: --nope\nmore") == "Unrecognized arguments: --nope"


REQUIRED = '''Parser key "data":
  Does not validate against any of the Union subtypes
  Subtypes: [<class 'lightning.pytorch.core.datamodule.LightningDataModule'>, <class 'NoneType'>]
  Errors:
    - Problem with given class_path 'lightprune.data.TextJsonlDataModule':
        the following arguments are required: tokenizer
    - Expected a <class 'NoneType'>
  Given value type: <class 'jsonargparse._namespace.Namespace'>
  Given value: Namespace(class_path='lightprune.data.TextJsonlDataModule', init_args=Namespace(tokenizer=None))'''

REQUIRED_NESTED = '''Parser key "trainer.callbacks":
  Does not validate against any of the Union subtypes
  Errors:
    - Problem with given class_path 'lightprune.callbacks.Evaluate':
        Parser key "data":
          Does not validate against any of the Union subtypes
          Errors:
            - Problem with given class_path 'my.DataModule':
                the following arguments are required: tokenizer, rows
            - Expected a <class 'NoneType'>
          Given value: Namespace(class_path='my.DataModule', init_args=Namespace(tokenizer=None))
    - Not a valid subclass of Callback
  Given value: [Namespace(class_path='lightprune.callbacks.Evaluate')]'''


def test_a_class_without_a_required_argument_names_the_options_to_set() -> None:
    assert condense(REQUIRED) == "TextJsonlDataModule needs tokenizer: set --data.init_args.tokenizer"
    assert condense(REQUIRED_NESTED) == ("DataModule needs tokenizer, rows: set --evaluate.data.init_args.tokenizer, "
                                         "--evaluate.data.init_args.rows")
    assert condense(REQUIRED_NESTED.replace("lightprune.callbacks.Evaluate", "my.Callback")) == (
        "DataModule needs tokenizer, rows: set --trainer.callbacks.init_args.data.init_args.tokenizer, "
        "--trainer.callbacks.init_args.data.init_args.rows")


def test_a_bad_option_value_is_one_line(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", "lightprune.cli.app", "export", "--config",
                           str(REPO / "configs" / "aimer_tiny.yaml"), "--trainer.callbacks.init_args.ratio", "abc",
                           "--trainer.default_root_dir", str(tmp_path / "run")], capture_output=True, text=True,
                          cwd=REPO)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("lightprune: error: ExpertPruning: ratio='abc' is not a float or null")
    assert "usage:" not in done.stderr and "Union" not in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("err", [OSError(errno.ENOSPC, "No space left on device", "/out/model"),
                                 PermissionError(errno.EACCES, "Permission denied", "/out"),
                                 FileExistsError("output directory '/out/model' exists and is not empty")])
def test_os_errors_are_one_line(monkeypatch, capsys, err) -> None:
    def fail():
        raise err

    monkeypatch.setattr(cli, "cli_main", fail)
    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 2
    assert capsys.readouterr().err == f"lightprune: error: {err}\n"


def test_lightprune_s_own_runtime_errors_are_one_line_and_bugs_keep_their_traceback(monkeypatch, capsys) -> None:
    from lightprune.data.cache import CacheError

    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    monkeypatch.setattr(cli, "cli_main", lambda: (_ for _ in ()).throw(CacheError("/c/manifest.json is missing")))
    with pytest.raises(SystemExit):
        cli.main()
    assert capsys.readouterr().err == "lightprune: error: /c/manifest.json is missing\n"
    monkeypatch.setattr(cli, "cli_main", lambda: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main()


def test_a_missing_required_argument_is_one_line_naming_the_option(tmp_path) -> None:
    """configs/reap.yaml without its tokenizer (the config's own comment says to set it): jsonargparse's Union
    listing ("... is not null") becomes the option to set."""
    done = subprocess.run([sys.executable, "-m", "lightprune.cli.app", "calibrate", "--config",
                           str(REPO / "configs" / "reap.yaml"), "--model.init_args.checkpoint", str(REPO),
                           "--trainer.default_root_dir", str(tmp_path / "run")], capture_output=True, text=True,
                          cwd=REPO, check=False, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(
        "lightprune: error: TextJsonlDataModule needs tokenizer: set --data.init_args.tokenizer"), done.stderr[-2000:]

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


@pytest.mark.exhaustive
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


@pytest.mark.exhaustive
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


NOT_A_SUBCLASS = '''Parser key "trainer.callbacks":
  Does not validate against any of the Union subtypes
  Subtypes: [list[lightning.pytorch.callbacks.callback.Callback], <class 'NoneType'>]
  Errors:
    - Import path does not correspond to a subclass of Callback
    - Import path does not correspond to a subclass of Callback
    - Expected a <class 'NoneType'>
  Given value type: <class 'str'>
  Given value: my.Thing'''

DENIED = '''Parser key "data":
  Does not validate against any of the Union subtypes
  Subtypes: [<class 'lightning.pytorch.core.datamodule.LightningDataModule'>, <class 'NoneType'>]
  Errors:
    - Problem with given class_path 'os.system':
        Importing 'os.system' is not allowed, denied by the 'os' entry of the import path denylist. Add ...
    - Expected a <class 'NoneType'>
  Given value type: <class 'str'>
  Given value: os.system'''

NOT_IMPORTED = '''Parser key "model":
  Does not validate against any of the Union subtypes
  Subtypes: [<class 'lightprune.finetune.causal_lm.MoECausalLM'>, <class 'NoneType'>]
  Errors:
    - Problem with given class_path 'my.Module':
        No module named 'my'
    - Expected a <class 'NoneType'>
  Given value type: <class 'str'>
  Given value: my.Module'''

NOT_ACCEPTED = '''Parser key "data":
  Does not validate against any of the Union subtypes
  Errors:
    - Problem with given class_path 'argparse.ArgumentParser':
        Option 'descripton' is not accepted
    - Expected a <class 'NoneType'>
  Given value type: <class 'jsonargparse._util.NestedArg'>
  Given value: NestedArg(key='descripton', val='x')'''


def test_a_class_outside_its_option_and_an_option_outside_its_class_are_one_line() -> None:
    """What the option accepts (in lightprune's words for the model, the data and a callback), that nothing was
    built, and the closest option of a class the parser has imported."""
    assert condense(NOT_A_SUBCLASS) == ("trainer.callbacks: 'my.Thing' is not a lightning.pytorch.Callback subclass; "
                                        "it was not built")
    assert condense(NOT_A_SUBCLASS.replace("my.Thing", "[Namespace(class_path='lightprune.callbacks.Export'), "
                                           "{'class_path': 'my.Thing'}]").replace(
        "Import path does", "Import path my.Thing does", 1)) == (
        "trainer.callbacks: 'my.Thing' is not a lightning.pytorch.Callback subclass; it was not built")
    assert condense(DENIED) == ("data: 'os.system' is not a LightningDataModule subclass: importing it is denied (the "
                                "'os' entry of jsonargparse's import denylist); it was not loaded")
    assert condense(NOT_IMPORTED) == "model: cannot import 'my.Module' (No module named 'my'); nothing was built"
    assert condense(NOT_ACCEPTED) == ("--data.init_args.descripton: ArgumentParser has no option 'descripton' (did "
                                      "you mean 'description'?)")
    assert condense(NOT_ACCEPTED.replace("'descripton'", "'init_arg.prog'")) == (
        "--data.init_args.init_arg: ArgumentParser has no option 'init_arg' (did you mean 'init_args'?)")
    assert condense('Parser key "trainer.max_steps":\n  Expected a <class \'int\'>. Got value: abc') == (
        "trainer.max_steps='abc' is not an integer")
    assert condense("unrecognized arguments: --trainer.max_step 3", ["--trainer.max_steps", "-c"]) == (
        "unrecognized arguments: --trainer.max_step 3 (did you mean '--trainer.max_steps'?)")


@pytest.mark.parametrize("option,line", [
    (["--trainer.max_step", "3"], "unrecognized arguments: --trainer.max_step 3 (did you mean '--trainer.max_steps'?)"),
    (["--model.init_args.checkpoin", "x"], "--model.init_args.checkpoin: MoECausalLM has no option 'checkpoin' (did "
     "you mean 'checkpoint'?)"),
])
def test_the_parser_takes_no_abbreviation(option, line, tmp_path, monkeypatch, capsys) -> None:
    """Without the first pass (``python -m lightprune.cli.app``, torchrun) a prefix of an option is not that
    option (argparse's allow_abbrev is off in every parser): refused naming the option meant."""
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["app.py", "export", "--config", "configs/aimer_tiny.yaml",
                                      "--trainer.default_root_dir", str(tmp_path / "run"), *option])
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 2
    assert capsys.readouterr().err == f"lightprune: error: {line} (`lightprune export --help` lists the options)\n"
    assert not (tmp_path / "run").exists()


def test_run_recipe_raises_the_commands_line_never_system_exit(tmp_path, monkeypatch) -> None:
    """lp.run_recipe: a bad option, a bad config, a parser error, --help: an OptionError (a ValueError) with the
    line the command prints."""
    from lightprune.cli.options import OptionError
    from lightprune.cli.recipe import run_recipe

    monkeypatch.chdir(REPO)
    recipe = "configs/aimer_tiny.yaml"
    root = {"trainer.default_root_dir": str(tmp_path / "run")}
    (tmp_path / "empty.yaml").write_text("")
    cases = [
        (recipe, {**root, "model.init_args.checkpoin": "x"}, "--model.init_args.checkpoin: MoECausalLM has no option "
         "'checkpoin' (did you mean 'checkpoint'?) (`lightprune export --help` lists the options)"),
        (recipe, {**root, "trainer.max_step": 3}, "`lightprune export` has no option '--trainer.max_step' (did you "
         "mean '--trainer.max_steps'?); `lightprune export --help` lists them"),
        (recipe, {**root, "help": True}, "overrides: 'help' prints and exits (`lightprune export --help` on the "
         "command line); it runs nothing"),
        (str(tmp_path / "empty.yaml"), root, f"config file {str(tmp_path / 'empty.yaml')!r} is empty; a config is a "
         "mapping of options (trainer:, model:, data:, ...; configs/ holds the recipes)"),
        ({"trainr": {}}, root, "--config: 'trainr' is not an option of `lightprune export` (did you mean 'trainer'?); "
         "its top-level keys: seed_everything, trainer, model, data"),
    ]
    for config, overrides, line in cases:
        with pytest.raises(OptionError) as info:
            run_recipe(config, "export", overrides)
        assert str(info.value) == line
    assert not (tmp_path / "run").exists()


def test_a_callback_given_by_an_unknown_name_is_one_line_with_the_closest() -> None:
    message = ('Parser key "trainer.callbacks":\n\n  - Expected a path but ReportPag either not accessible or invalid\n'
               "  - Does not validate against any of the Union subtypes\n  Errors:\n"
               "    - Expected a dot import path string: ReportPag\n    - Expected a <class 'NoneType'>\n"
               "  Given value type: <class 'str'>\n  Given value: ReportPag\n")
    assert condense(message) == (
        "trainer.callbacks: 'ReportPag' is no callback's class name (did you mean 'ReportPage'?); lightprune's: "
        "ExpertStats, RouterDelta, ExpertPruning, Export, WidthSearch, WidthExport, Evaluate, ReportPage; Lightning's "
        "by name too (EarlyStopping), others by class path (package.module.Class)")


def test_lightnings_configuration_errors_are_one_line(monkeypatch, capsys) -> None:
    """A MisconfigurationException raised while the job runs (a loop without its data: Lightning's traceback) is one
    line and exit status 2; a fit without data says what it needs and which subcommand runs without."""
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["lightprune", "validate", "--config", "c.yaml"])
    raised = MisconfigurationException("`val_dataloader` must be implemented to be used with the Lightning Trainer")
    monkeypatch.setattr(cli, "cli_main", lambda: (_ for _ in ()).throw(raised))
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 2
    assert capsys.readouterr().err == (
        "lightprune: error: `lightprune validate` needs validation data: a data module with a val split (--data CLASS, "
        "or data: in the config), and the job has none; a job without data runs as `lightprune export` (weight "
        "criteria such as aimer)\n")
    raised = MisconfigurationException("No `test_step()` method defined to run `Trainer.test`.\nmore")
    with pytest.raises(SystemExit):
        cli.main()
    assert capsys.readouterr().err == "lightprune: error: No `test_step()` method defined to run `Trainer.test`.\n"


def test_fit_without_training_data_is_refused_before_anything_is_built(tmp_path, monkeypatch, capsys) -> None:
    """``lightprune fit --config configs/aimer_tiny.yaml`` printed Lightning's 60-line traceback: one line, before
    the model is built."""
    from lightprune.finetune import MoECausalLM

    monkeypatch.chdir(REPO)
    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    monkeypatch.setattr(MoECausalLM, "configure_model", lambda self: pytest.fail("the model was built"))
    monkeypatch.setattr(sys, "argv", ["lightprune", "fit", "--config", "configs/aimer_tiny.yaml",
                                      "--trainer.default_root_dir", str(tmp_path / "run")])
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "lightprune: error: `lightprune fit` needs training data: a data module with a train split (--data CLASS, or "
        "data: in the config), and the job has none; a job without data runs as `lightprune export` (weight criteria "
        "such as aimer)")
    assert not (tmp_path / "run").exists()

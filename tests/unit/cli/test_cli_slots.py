"""A class path outside what its slot accepts (a callback, the model, the data, a criterion) is refused in one line
saying what the slot accepts, and is never built; the first pass refuses it before importing anything where the
name or the module's source settles it (cli.slots), the parser imports the rest and refuses it unbuilt."""

from __future__ import annotations

import sys

import pytest
from fixtures import REPO

from lightprune.cli.command_line_checks import check_command_line
from lightprune.cli.options import OptionError

CALLBACK = "a lightning.pytorch.Callback subclass"
MODEL = "a LightningModule (lightprune.finetune.MoECausalLM or a subclass)"
DATA = "a LightningDataModule subclass"
CRITERION = "a registered criterion name or a lightprune Criterion subclass"
STDLIB = "it names Python's standard library; it was not loaded"

# (options, the config's content, the line)
STANDARD_LIBRARY = [
    (["--trainer.callbacks+=os.system"], None, f"--trainer.callbacks+: 'os.system' is not {CALLBACK}: {STDLIB}"),
    (["--trainer.callbacks+={class_path: subprocess.Popen}"], None,
     f"--trainer.callbacks+: 'subprocess.Popen' is not {CALLBACK}: {STDLIB}"),
    (["--model", "os.system"], None, f"--model: 'os.system' is not {MODEL}: {STDLIB}"),
    (["--model.class_path", "subprocess.Popen"], None,
     f"--model.class_path: 'subprocess.Popen' is not {MODEL}: {STDLIB}"),
    (["--data", "subprocess.Popen"], None, f"--data: 'subprocess.Popen' is not {DATA}: {STDLIB}"),
    (["--prune.criterion", "os.system"], None, f"--prune.criterion: 'os.system' is not {CRITERION}: {STDLIB}"),
    (["--evaluate.data", "subprocess.Popen"], None, f"--evaluate.data: 'subprocess.Popen' is not {DATA}: {STDLIB}"),
    ([], "trainer:\n  callbacks:\n    - class_path: lightprune.callbacks.Export\n    - os.system\n",
     f"config file 'c.yaml': trainer.callbacks: 'os.system' is not {CALLBACK}: {STDLIB}"),
    ([], "trainer:\n  callbacks:\n    - class_path: lightprune.callbacks.ExpertPruning\n      init_args:\n"
         "        criterion: {class_path: subprocess.Popen}\n",
     f"config file 'c.yaml': ExpertPruning.criterion: 'subprocess.Popen' is not {CRITERION}: {STDLIB}"),
    ([], "trainer:\n  callbacks:\n    - class_path: lightprune.callbacks.Evaluate\n      init_args:\n"
         "        data: subprocess.Popen\n",
     f"config file 'c.yaml': Evaluate.data: 'subprocess.Popen' is not {DATA}: {STDLIB}"),
    ([], "model:\n  class_path: os.system\n", f"config file 'c.yaml': model: 'os.system' is not {MODEL}: {STDLIB}"),
    ([], "data: subprocess.Popen\n", f"config file 'c.yaml': data: 'subprocess.Popen' is not {DATA}: {STDLIB}"),
]


@pytest.mark.parametrize("options,config,message", STANDARD_LIBRARY)
def test_a_name_of_the_standard_library_is_refused_in_every_slot(options, config, message, tmp_path,
                                                                  monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    if config:
        (tmp_path / "c.yaml").write_text(config)
    job = ["export", "--config", str(REPO / "configs" / "aimer_tiny.yaml"), "--trainer.default_root_dir", "run"]
    with pytest.raises(OptionError) as info:
        check_command_line([*job, *(["--config", "c.yaml"] if config else []), *options])
    assert str(info.value) == message


SIDE_EFFECT = '''import pathlib

pathlib.Path(__file__).with_name("IMPORTED").write_text("x")


def thing():
    pathlib.Path(__file__).with_name("CALLED").write_text("x")


class Plain:
    pass


class Based(dict):
    def __init__(self, *args, **kwargs):
        pathlib.Path(__file__).with_name("BUILT").write_text("x")
'''


@pytest.fixture
def sidefx(tmp_path, monkeypatch):
    """A module in the working directory (on sys.path, as the command puts it) that writes IMPORTED when imported and
    BUILT when its class Based is built."""
    (tmp_path / "sidefx.py").write_text(SIDE_EFFECT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    yield tmp_path
    sys.modules.pop("sidefx", None)


def test_the_first_pass_refuses_what_the_source_settles_without_importing_it(sidefx) -> None:
    job = ["export", "--config", str(REPO / "configs" / "aimer_tiny.yaml"), "--trainer.default_root_dir", "run"]
    cases = {
        "sidefx.thing": "sidefx.thing is a function",
        "sidefx.Plain": "class sidefx.Plain has no base class",
        "sidefx.Basd": "module 'sidefx' has no 'Basd' (did you mean 'Based'?)",
        "sidefx_missing.Thing": "no module named 'sidefx_missing'",
        "lightprun.callbacks.Export": "no module named 'lightprun' (did you mean 'lightprune'?)",
        "lightprune.callbacks.ExpertPrunning": "lightprune.callbacks has no 'ExpertPrunning' (did you mean "
                                               "'ExpertPruning'?)",
        "lightprune.finetune.MoECausalLm": "module 'lightprune.finetune' has no 'MoECausalLm' (did you mean "
                                           "'MoECausalLM'?)",
        "lightprune.finetune.causal_lm": "lightprune.finetune.causal_lm is a module",
    }
    for path, reason in cases.items():
        for option, slot in (("--trainer.callbacks+", CALLBACK), ("--model", MODEL)):
            with pytest.raises(OptionError) as info:
                check_command_line([*job, option, path])
            assert str(info.value) == f"{option}: {path!r} is not {slot}: {reason}; it was not loaded"
    check_command_line([*job, "--trainer.callbacks+=sidefx.Based"])  # a class with a base: only importing tells
    assert not (sidefx / "IMPORTED").exists() and "sidefx" not in sys.modules
    # a project module named like one of the standard library's, which import finds first in the working directory
    (sidefx / "this.py").write_text("import lightning\n\n\nclass Zen(lightning.Callback):\n    pass\n")
    check_command_line([*job, "--trainer.callbacks+=this.Zen"])
    (sidefx / "this.py").unlink()
    with pytest.raises(OptionError, match="'this.Zen' is not a lightning.pytorch.Callback subclass: it names Python's "
                                          "standard library"):
        check_command_line([*job, "--trainer.callbacks+=this.Zen"])


def test_the_parser_refuses_a_class_outside_its_slot_without_building_it(sidefx, monkeypatch, capsys) -> None:
    """What the source does not settle is imported by the parser (its module runs) and refused, never built; a
    name on jsonargparse's import denylist is refused before its import (antigravity opens a web browser)."""
    from lightprune.cli import command

    job = ["lightprune", "export", "--config", str(REPO / "configs" / "aimer_tiny.yaml"),
           "--trainer.default_root_dir", str(sidefx / "run")]
    cases = [(["--trainer.callbacks+=sidefx.Based"], f"trainer.callbacks: 'sidefx.Based' is not {CALLBACK}; it was "
                                                     "not built (`lightprune export --help` lists the options)"),
             (["--trainer.logger", "antigravity.fly"], "trainer.logger: 'antigravity.fly' is not a Logger subclass: "
              "importing it is denied (the 'antigravity' entry of jsonargparse's import denylist); it was not loaded "
              "(`lightprune export --help` lists the options)"),
             (["--prune.criterion", "sidefx.Based"], "criterion 'sidefx.Based' is not a registered criterion name or "
              "a Criterion subclass (it is <class 'sidefx.Based'>); it was not built")]
    for options, line in cases:
        monkeypatch.setattr(sys, "argv", [*job, *options])
        with pytest.raises(SystemExit) as info:
            command.main()
        assert info.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == f"lightprune: error: {line}"
    assert (sidefx / "IMPORTED").exists() and not (sidefx / "BUILT").exists()
    assert "antigravity" not in sys.modules and not (sidefx / "run").exists()


def test_a_class_of_a_loaded_module_without_a_spec_is_left_to_the_parser(monkeypatch) -> None:
    """A script's or a notebook's ``__main__`` is in sys.modules with no ``__spec__`` (nothing import could look
    at): its classes were refused as "no module named '__main__'", though the parser imports them (run_recipe is
    for notebooks); only the parser can tell."""
    import types

    from lightprune.cli.slots import class_path_problem

    main = types.ModuleType("__main__")
    assert main.__spec__ is None
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert class_path_problem("__main__.MyCallback", "callback") is None
    assert class_path_problem({"class_path": "__main__.MyModel"}, "model") is None
    with pytest.raises(OptionError, match=r"^--trainer.callbacks\+: 'nomodule_xyz.C' is not a lightning.pytorch."
                                          r"Callback subclass: no module named 'nomodule_xyz'; it was not loaded$"):
        check_command_line(["export", "--config", str(REPO / "configs" / "aimer_tiny.yaml"),
                            "--trainer.callbacks+=nomodule_xyz.C"])  # a module nowhere: still refused


GLOBALS = '''import lightning


def define():
    global Late
    class Late(lightning.Callback):
        pass


define()


def also(x):
    global Counter, Other
    Counter = x
'''


def test_a_name_a_function_binds_through_global_is_left_to_the_parser(tmp_path, monkeypatch) -> None:
    """``global X`` in a function binds X at module level when the function runs: such a name was refused as
    "module 'm' has no 'X'"; a name bound nowhere still is (with the global names as suggestions)."""
    from lightprune.cli.slots import class_path_problem

    (tmp_path / "globalmod.py").write_text(GLOBALS)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert class_path_problem("globalmod.Late", "callback") is None
    assert class_path_problem("globalmod.Counter", "callback") is None
    assert class_path_problem("globalmod.Lat", "callback") == (
        f"'globalmod.Lat' is not {CALLBACK}: module 'globalmod' has no 'Lat' (did you mean 'Late'?); it was not "
        "loaded")
    assert class_path_problem("globalmod.define", "callback") == (
        f"'globalmod.define' is not {CALLBACK}: globalmod.define is a function; it was not loaded")
    assert "globalmod" not in sys.modules

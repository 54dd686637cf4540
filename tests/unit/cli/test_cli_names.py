"""The command line's names known without Lightning (cli.names): the trainer's and the subcommands' options are
Lightning's own (checked here against the signatures and LightningCLI's parsers), and a mistyped subcommand, option or
config key is refused by the first pass in one line with the closest name."""

from __future__ import annotations

import inspect

import pytest
from fixtures import REPO

from lightprune.cli.command_line_checks import check_command_line
from lightprune.cli.names import METHOD_OPTIONS, TRAINER_OPTIONS, argv_problem, config_keys_problem, did_you_mean
from lightprune.cli.options import SUBCOMMANDS, OptionError


def _parsers() -> dict[str, object]:
    """LightpruneCLI's parser of each subcommand, built without parsing anything."""
    from lightprune.cli import app
    from lightprune.cli.trainer import PruneTrainer
    from lightprune.finetune import MoECausalLM

    built = []

    class Probe(app.LightpruneCLI):
        def parse_arguments(self, parser, args):
            built.append(self)
            raise SystemExit(0)

    with pytest.raises(SystemExit):
        Probe(MoECausalLM, None, trainer_class=PruneTrainer, subclass_mode_model=True, subclass_mode_data=True,
              args=[], auto_configure_optimizers=False)
    return {"": built[0].parser, **built[0]._subcommand_parsers}


def test_the_static_names_are_lightnings() -> None:
    """TRAINER_OPTIONS is Trainer.__init__'s signature and METHOD_OPTIONS what LightningCLI adds from each trainer
    method; every option of every parser is one the first pass knows, and every name it knows is a parser's."""
    import lightning.pytorch as pl

    from lightprune.cli import names
    from lightprune.cli.app import LightpruneCLI
    from lightprune.cli.trainer import PruneTrainer

    signature = tuple(p for p in inspect.signature(pl.Trainer.__init__).parameters if p != "self")
    assert TRAINER_OPTIONS == signature, f"TRAINER_OPTIONS = {signature!r}"
    methods = {command: tuple(p for p in inspect.signature(getattr(PruneTrainer, command)).parameters
                              if p != "self" and p not in skip)
               for command, skip in LightpruneCLI.subcommands().items()}
    assert METHOD_OPTIONS == methods, f"METHOD_OPTIONS = {methods!r}"
    parsers = _parsers()
    assert sorted(parsers[""]._option_string_actions) == sorted([*names.MAIN_OPTIONS, "-c", "-h"])
    assert set(parsers) - {""} == set(SUBCOMMANDS)
    for command in SUBCOMMANDS:
        real = set(parsers[command]._option_string_actions)
        assert all(names._known(option, command) for option in real), command
        assert set(names._subcommand_options(command)) <= real, command


@pytest.mark.parametrize("argv,message", [
    (["calibrat", "--config", "c.yaml"], "'calibrat' is not a subcommand of lightprune (did you mean 'calibrate'?); "
     "the subcommands: fit, validate, test, predict, calibrate, export, convert-gguf"),
    (["convert-guff", "x"], "'convert-guff' is not a subcommand of lightprune (did you mean 'convert-gguf'?); "
     "the subcommands: fit, validate, test, predict, calibrate, export, convert-gguf"),
    (["calibrate", "--confg", "c.yaml"], "`lightprune calibrate` has no option '--confg' (did you mean '--config'?); "
     "`lightprune calibrate --help` lists them"),
    (["export", "--trainer.max_step", "3"], "`lightprune export` has no option '--trainer.max_step' (did you mean "
     "'--trainer.max_steps'?); `lightprune export --help` lists them"),
    (["export", "--trainer.max_step=3"], "`lightprune export` has no option '--trainer.max_step' (did you mean "
     "'--trainer.max_steps'?); `lightprune export --help` lists them"),
    (["export", "--ckpt_path", "x"], "`lightprune export` has no option '--ckpt_path'; `lightprune export --help` "
     "lists them"),
    (["--nope"], "lightprune has no option '--nope'; before the subcommand it takes --config, --print_config, "
     "--help"),
    (["--trainer.max_steps", "3", "fit"], "lightprune has no option '--trainer.max_steps'; before the subcommand it "
     "takes --config, --print_config, --help; a subcommand's options go after it (lightprune SUBCOMMAND "
     "--trainer.max_steps ...)"),
    (["calibrate", "--config"], "--config needs a value: a YAML config file (configs/ holds the recipes)"),
    (["--config"], "--config needs a value: a YAML config file (configs/ holds the recipes)"),
    (["export", "--trainer.max_steps"], "--trainer.max_steps needs a value"),
    (["export", "--trainer.fast_dev_run", "--trainer.max_steps", "3"], "--trainer.fast_dev_run needs a value"),
    (["calibrate", "configs/quickstart.yaml"], "`lightprune calibrate` takes options only, not "
     "'configs/quickstart.yaml' (a config file is given as --config FILE)"),
])
def test_a_name_no_parser_takes_is_one_line(argv, message) -> None:
    assert argv_problem(argv, SUBCOMMANDS, ["convert-gguf"]) == message
    with pytest.raises(OptionError) as info:
        check_command_line(argv, others=["convert-gguf"])
    assert str(info.value) == message


def test_the_names_the_parsers_take_pass() -> None:
    for argv in (["fit", "--trainer.callbacks+=lightprune.callbacks.Export", "--trainer.callbacks+", "X",
                  "--trainer.logger.init_args.save_dir", "d", "--trainer.devices+=1", "--ckpt_path", "c",
                  "--weights_only", "true", "--model.init_args.anything", "1", "--data.help", "D", "-c", "c.yaml",
                  "--print_config=skip_null", "--seed_everything", "1", "--trainer", "t.yaml"],
                 ["-c", "c.yaml", "--print_config", "export"], ["test", "--verbose", "false"],
                 ["convert-gguf", "a", "b"],
                 ["predict", "--return_predictions", "true", "--trainer.max_steps", "-1"]):
        assert argv_problem(argv, SUBCOMMANDS, ["convert-gguf"]) is None, argv


def test_help_and_print_config_are_the_parsers_whatever_else_is_given(tmp_path) -> None:
    """`SUBCOMMAND --help` prints the help even after a mistyped option or over an earlier run's outputs (only the
    subcommand's name is checked); --print_config builds nothing, so an earlier run's outputs do not stop it."""
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "model" / "config.json").write_text("{}")
    job = ["export", "--config", str(REPO / "configs" / "aimer_tiny.yaml"), "--trainer.default_root_dir", str(run)]
    with pytest.raises(OptionError, match="exists and is not empty"):
        check_command_line(job)
    check_command_line([*job, "--print_config"])
    check_command_line([*job, "--help"])
    check_command_line(["calibrate", "--confg", "x", "--help"])
    with pytest.raises(OptionError, match="'calibrat' is not a subcommand"):
        check_command_line(["calibrat", "--help"])
    with pytest.raises(OptionError, match="has no option '--confg'"):
        check_command_line([*job, "--confg", "x", "--print_config"])


def test_a_config_key_no_option_takes_is_one_line() -> None:
    assert config_keys_problem({"trainr": {}}, "export", "config file 'c.yaml'") == (
        "config file 'c.yaml': 'trainr' is not an option of `lightprune export` (did you mean 'trainer'?); "
        "its top-level keys: seed_everything, trainer, model, data")
    assert config_keys_problem({"ckpt_path": None}, "export", "--config") == (
        "--config: 'ckpt_path' is not an option of `lightprune export`; its top-level keys: seed_everything, "
        "trainer, model, data")
    assert config_keys_problem({"trainer": {"max_step": 3}}, "fit", "c") == (
        "c: trainer.max_step is not an option of the trainer (did you mean 'max_steps'?); `lightprune fit --help` "
        "lists them")
    good = {"seed_everything": 0, "trainer": {"max_steps": 3, "callbacks": []}, "model": {}, "data": None,
            "ckpt_path": None, "config": "other.yaml", "$schema": "s.json"}
    assert config_keys_problem(good, "fit", "c") is None
    assert did_you_mean("quickstrt.yaml", ["quickstart.yaml", "reap.yaml"]) == " (did you mean 'quickstart.yaml'?)"
    assert did_you_mean("zzz", ["quickstart.yaml"]) == ""


def test_precisions_are_the_ones_lightning_takes(tmp_path) -> None:
    """PRECISIONS is Trainer(precision=...)'s Literal values; the first pass refuses any other with the list and the
    closest name (the parser said "is not an integer or null", listing none), from the command line and a config."""
    import typing

    import lightning.pytorch as pl

    from lightprune.cli.names import PRECISIONS, precision_problem

    annotation = inspect.signature(pl.Trainer.__init__).parameters["precision"].annotation
    literals = [value for arg in typing.get_args(annotation) for value in typing.get_args(arg)]
    assert sorted(map(str, PRECISIONS)) == sorted(map(str, literals)) and len(PRECISIONS) == len(literals)
    for good in (*PRECISIONS, None):
        assert precision_problem(good) is None
    listed = ("transformer-engine, transformer-engine-float16, 16-true, 16-mixed, bf16-true, bf16-mixed, 32-true, "
              "64-true, bf16 (or 64, 32, 16)")
    assert precision_problem("bf16-ture") == f"precision 'bf16-ture' is not one Lightning takes (did you mean " \
                                             f"'bf16-true'?); it takes {listed}"
    assert precision_problem(8) == f"precision 8 is not one Lightning takes; it takes {listed}"
    assert precision_problem(16.0) is not None and precision_problem(True) is not None
    job = ["export", "--config", str(REPO / "configs" / "aimer_tiny.yaml"), "--trainer.default_root_dir",
           str(tmp_path / "run")]
    with pytest.raises(OptionError, match=r"^--trainer.precision: precision '17-true' is not one Lightning takes"):
        check_command_line([*job, "--trainer.precision", "17-true"])
    config = tmp_path / "c.yaml"
    config.write_text("trainer:\n  precision: bf16_true\n")
    with pytest.raises(OptionError, match=rf"^config file {str(config)!r}: trainer.precision: precision 'bf16_true' "
                                          r"is not one Lightning takes \(did you mean 'bf16-true'\?\)"):
        check_command_line([*job, "--config", str(config)])
    for good in ("bf16-true", "16", "64-true", "bf16"):
        check_command_line([*job, "--trainer.precision", good])

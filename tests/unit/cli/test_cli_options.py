"""The callbacks' stable addresses and the command line's checks before Lightning: the same rules and messages as
the callbacks' constructors, read from the command line and the config files alone."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lightprune.cli.command_line_checks import check_command_line
from lightprune.cli.options import (
    ADDRESSES,
    ARGUMENTS,
    Addressed,
    OptionError,
    check_callback_options,
    split_addressed,
)
from lightprune.core import choices


def test_arguments_are_the_callbacks_signatures() -> None:
    import lightprune.callbacks as callbacks
    from lightprune.callbacks.options import OPTIONS

    assert set(ADDRESSES.values()) == set(ARGUMENTS) == set(OPTIONS) == set(callbacks.__all__)
    for name, arguments in ARGUMENTS.items():
        cls = getattr(callbacks, name)
        assert cls.OPTIONS is OPTIONS[name]
        assert arguments == tuple(p for p in inspect.signature(cls.__init__).parameters if p != "self"), name


def test_a_callback_whose_constructor_differs_from_its_spec_is_refused_when_defined() -> None:
    from lightprune.callbacks.options import CallbackOptions, uses_options

    spec = CallbackOptions("Probe", "probe", "a probe", {"ratio": None, "seed": None})

    with pytest.raises(TypeError, match=r"Probe.__init__ takes \['ratio'\], its option spec lists \['ratio', 'seed'\]"):
        @uses_options(spec)
        class Probe:
            def __init__(self, ratio: float = 0.5):
                self.ratio = ratio

    @uses_options(spec)
    class Good:
        def __init__(self, ratio: float = 0.5, seed: int = 0):
            self.ratio, self.seed = ratio, seed

    assert Good.OPTIONS is spec
    with pytest.raises(KeyError, match="Probe has no option 'sed'; its options: ratio, seed"):
        spec.check("sed", 1)


def test_choices_are_what_the_modules_accept() -> None:
    from lightprune.experts.calibration import SUBSETS
    from lightprune.experts.sensitivity import SCORES
    from lightprune.width.retention import METRICS

    assert (SUBSETS, SCORES, METRICS) == (choices.SUBSETS, choices.SENSITIVITY_SCORES, choices.RETENTION_METRICS)


def test_the_command_line_reads_criterion_names_without_torch() -> None:
    code = ("import sys; from lightprune.cli.options import check_callback_options; "
            "check_callback_options('ExpertPruning', {'criterion': 'reap'}, 'here'); "
            "check_callback_options('ExpertStats', {'criteria': ['delta_h', 'expert_outputs']}, 'here'); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# (callback, options that are fine together, the one bad option)
BAD = [
    ("ExpertPruning", {}, {"ratio": 1.5}),
    ("ExpertPruning", {}, {"ratio": "abc"}),
    ("ExpertPruning", {}, {"criterion": "reapp"}),
    ("ExpertPruning", {}, {"allocation": "globl"}),
    ("ExpertPruning", {}, {"subset": "txt"}),
    ("ExpertPruning", {}, {"normalize": "zscore"}),
    ("ExpertPruning", {"ratio": None}, {"n_per_layer": -1}),
    ("ExpertStats", {}, {"subsets": ["all", "txt"]}),
    ("ExpertStats", {}, {"criteria": ["reap", "expert_output"]}),
    ("ExpertStats", {}, {"save_every_n_batches": -1}),
    ("RouterDelta", {}, {"score": "logits"}),
    ("RouterDelta", {}, {"holdout_batches": 0}),
    ("Export", {}, {"atol": -1.0}),
    ("WidthExport", {}, {"align": 0}),
    ("WidthSearch", {}, {"metric": "tokens"}),
    ("WidthSearch", {}, {"align": 0}),
    ("WidthSearch", {}, {"recovery_epochs": 0}),
    ("Evaluate", {}, {"metric": "acc"}),
    ("Evaluate", {}, {"split": "train"}),
    ("Evaluate", {}, {"max_batches": 0}),
]


@pytest.mark.parametrize("callback,fine,bad", BAD, ids=lambda v: str(v) if isinstance(v, str) else None)
def test_a_bad_option_gets_the_callbacks_own_message(callback, fine, bad, monkeypatch) -> None:
    import lightprune.callbacks as callbacks
    from lightprune.experts.criteria import registry

    with registry.CRITERIA.restoring():  # the registry as a fresh process has it (other tests register their own)
        for name, cls in list(registry.CRITERIA.items()):
            if not cls.__module__.startswith("lightprune."):
                registry.unregister_criterion(name)
        with pytest.raises(ValueError) as built:
            getattr(callbacks, callback)(**fine, **bad)
        with pytest.raises(OptionError) as checked:
            check_callback_options(callback, {**fine, **bad}, "here")
    assert str(checked.value) == f"here: {built.value}"


def test_good_options_pass() -> None:
    check_callback_options("ExpertPruning", {"criterion": "reap", "ratio": 0.5, "allocation": "global",
                                             "subset": "text", "normalize": None}, "here")
    check_callback_options("ExpertPruning", {"criterion": "my.module.MyCriterion"}, "here")
    check_callback_options("ExpertPruning", {"criterion": {"class_path": "callbacks.x.Y"}}, "here")
    check_callback_options("ExpertStats", {"subsets": ["all", "vision_low_attn"],
                                           "criteria": ["reap", "expert_outputs"]}, "here")
    # a project module may register criteria by name: a name is then left to the callback
    check_callback_options("ExpertPruning", {"criterion": "my_norm"}, "here", criteria_known=False)


def test_split_addressed_takes_out_the_addresses_and_reads_their_values_as_yaml() -> None:
    argv = ["calibrate", "--config", "c.yaml", "--prune.ratio", "0.3", "--trainer.max_steps", "2",
            "--stats.subsets=[all, text]", "--export.overwrite", "true", "--prune.normalize", "null",
            "--prune.criterion=reap", "--model.init_args.x", "1"]
    rest, found = split_addressed(argv)
    assert rest == ["calibrate", "--config", "c.yaml", "--trainer.max_steps", "2", "--model.init_args.x", "1"]
    assert found == [Addressed("--prune.ratio", "ExpertPruning", "ratio", 0.3),
                     Addressed("--stats.subsets", "ExpertStats", "subsets", ["all", "text"]),
                     Addressed("--export.overwrite", "Export", "overwrite", True),
                     Addressed("--prune.normalize", "ExpertPruning", "normalize", None),
                     Addressed("--prune.criterion", "ExpertPruning", "criterion", "reap")]
    with pytest.raises(OptionError, match=r"--prune.ratoi: ExpertPruning has no option 'ratoi' \(did you mean "
                                          r"'ratio'\?\); its options: criterion, ratio"):
        split_addressed(["--prune.ratoi", "0.3"])
    with pytest.raises(OptionError, match="no option 'zzz'; its options: "):  # nothing close: no guess
        split_addressed(["--prune.zzz", "0.3"])
    # an option of a class given as a callback's option: the callback's option must exist, the rest is the class's
    assert split_addressed(["--evaluate.data.init_args.preset", "micro"])[1] == [
        Addressed("--evaluate.data.init_args.preset", "Evaluate", "data.init_args.preset", "micro")]
    check_callback_options("Evaluate", {"data.init_args.preset": "micro"}, "here")
    with pytest.raises(OptionError, match="Evaluate has no option 'dat'"):
        split_addressed(["--evaluate.dat.init_args.preset", "micro"])
    with pytest.raises(OptionError, match="--prune.ratio needs a value"):
        split_addressed(["fit", "--prune.ratio"])


def _config(path: Path, callbacks: list) -> str:
    path.write_text(yaml.safe_dump({"trainer": {"callbacks": callbacks}}))
    return str(path)


def test_the_command_line_is_checked_as_jsonargparse_builds_it(tmp_path: Path) -> None:
    first = _config(tmp_path / "a.yaml", [{"class_path": "lightprune.callbacks.Export"},
                                          {"class_path": "lightprune.callbacks.ExpertPruning",
                                           "init_args": {"ratio": 0.5}}])
    second = _config(tmp_path / "b.yaml", [{"class_path": "lightprune.callbacks.Evaluate"}])
    check_command_line(["calibrate", "--config", first, "--prune.ratio", "0.25"])
    # the config file's own values
    bad = _config(tmp_path / "bad.yaml", [{"class_path": "lightprune.callbacks.ExpertPruning",
                                           "init_args": {"criterion": "reapp"}}])
    with pytest.raises(OptionError, match=f"{bad}: ExpertPruning: unknown criterion 'reapp'; available: aimer"):
        check_command_line(["export", "--config", bad])
    # --trainer.callbacks.init_args.X sets the last callback listed: ExpertPruning here, Evaluate after b.yaml
    # (a later config's list replaces the earlier one), the appended one after +=
    with pytest.raises(OptionError, match="--trainer.callbacks.init_args.ratio: ratio must be in"):
        check_command_line(["export", "--config", first, "--trainer.callbacks.init_args.ratio", "2"])
    with pytest.raises(OptionError, match="--trainer.callbacks.init_args.ratio: Evaluate has no option 'ratio'"):
        check_command_line(["export", "--config", first, "--config", second, "--trainer.callbacks.init_args.ratio",
                            "0.5"])
    with pytest.raises(OptionError, match="metric must be one of"):
        check_command_line(["export", "--config", first, "--config", second,
                            "--trainer.callbacks.init_args.metric=acc"])
    with pytest.raises(OptionError, match="subsets must each be one of"):
        check_command_line(["calibrate", "--config", second, "--trainer.callbacks+=lightprune.callbacks.ExpertStats",
                            "--trainer.callbacks.init_args.subsets=[txt]"])
    # an address of a callback the job does not have
    with pytest.raises(OptionError, match="--prune.ratio: the job has no ExpertPruning callback \\(add one: "
                                          "--trainer.callbacks\\+=lightprune.callbacks.ExpertPruning\\)"):
        check_command_line(["export", "--config", first, "--config", second, "--prune.ratio", "0.3"])
    # a project's own callback may subclass it, and its module may register criteria: left to the callbacks
    own = _config(tmp_path / "own.yaml", [{"class_path": "callbacks.mine.MyPruning"}])
    check_command_line(["export", "--config", own, "--prune.ratio", "0.3", "--prune.criterion", "my_norm"])
    # a list the checks do not follow: nothing is assumed about its last callback
    check_command_line(["export", "--config", first, "--trainer.callbacks=[]", "--trainer.callbacks.init_args.ratio",
                        "2"])


def test_an_option_error_comes_before_lightning_is_imported(tmp_path: Path) -> None:
    config = _config(tmp_path / "c.yaml", [{"class_path": "lightprune.callbacks.ExpertPruning"}])
    code = ("import sys; from lightprune.cli.command import main\n"
            f"sys.argv = ['lightprune', 'export', '--config', {config!r}, '--prune.criterion', 'reapp']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    print(e.code)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'torch', 'transformers'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["2", "[]"], done.stderr
    assert done.stderr.startswith("lightprune: error: --prune.criterion: unknown criterion 'reapp'; available: ")


TINY = Path(__file__).resolve().parents[3] / "configs" / "aimer_tiny.yaml"


def test_a_config_before_the_subcommand_is_refused_saying_where_it_goes(tmp_path) -> None:
    """``lightprune --config X export``: the main parser reads a config keyed by subcommand; one holding a
    subcommand's options is refused naming the file, its first key and the command line that works (the parser named
    a key from inside the config)."""
    with pytest.raises(OptionError) as info:
        check_command_line(["--config", str(TINY), "export", "--trainer.default_root_dir", str(tmp_path)])
    assert str(info.value) == (
        f"config file {str(TINY)!r} is given before the subcommand, where a config maps subcommands to their options "
        f"(export: {{...}}), and its key 'seed_everything' is not a subcommand; give it after the subcommand: "
        f"lightprune export --config {TINY} ...")
    keyed = tmp_path / "keyed.yaml"
    keyed.write_text("export:\n  trainer:\n    max_steps: 1\n")
    check_command_line(["--config", str(keyed), "export", "--config", str(TINY), "--trainer.default_root_dir",
                        str(tmp_path)])  # keyed by subcommand: taken


def test_a_config_keyed_by_subcommand_gives_its_subcommands_callbacks(tmp_path) -> None:
    """``lightprune --config k.yaml export --prune.ratio 0.3`` with the callbacks under ``export:`` in k.yaml was
    refused as "the job has no ExpertPruning callback": the first pass reads the subcommand's section (and only it)
    as the parser does."""
    import yaml

    job = yaml.safe_load(TINY.read_text())
    job["trainer"]["default_root_dir"] = str(tmp_path / "run")
    keyed = tmp_path / "k.yaml"
    keyed.write_text(yaml.safe_dump({"export": job}))
    check_command_line(["--config", str(keyed), "export", "--prune.ratio", "0.3"])
    with pytest.raises(OptionError) as info:  # its callbacks' options are checked as a config's after the subcommand
        check_command_line(["--config", str(keyed), "export", "--prune.ratio", "1.5"])
    assert str(info.value).startswith("--prune.ratio: ratio must be in [0, 1), got 1.5")
    bad = {**job, "trainer": {**job["trainer"], "callbacks": [
        {"class_path": "lightprune.callbacks.ExpertPruning", "init_args": {"criterion": "aimer", "ratio": 2}}]}}
    keyed.write_text(yaml.safe_dump({"export": bad}))
    with pytest.raises(OptionError) as info:
        check_command_line(["--config", str(keyed), "export"])
    assert str(info.value).startswith(f"{keyed}: ExpertPruning: ratio must be in [0, 1), got 2")
    keyed.write_text(yaml.safe_dump({"fit": job}))  # another subcommand's section: not this job's
    with pytest.raises(OptionError) as info:
        check_command_line(["--config", str(keyed), "export", "--prune.ratio", "0.3"])
    assert str(info.value) == ("--prune.ratio: the job has no ExpertPruning callback (add one: "
                               "--trainer.callbacks+=lightprune.callbacks.ExpertPruning)")
    check_command_line(["--config", str(keyed), "fit", "--prune.ratio", "0.3"])
    assert not (tmp_path / "run").exists()


def test_yaml_1_2_floats_are_numbers_in_the_first_pass_and_the_parser(tmp_path, capsys, monkeypatch) -> None:
    """``--prune.ratio 5e-1`` and ``ratio: 5e-1`` were refused as "must be in [0, 1), got '5e-1'" (YAML 1.1 reads
    them as text); both readers now take them as 0.5, and a float outside [0, 1) is refused as a number."""
    from lightprune.cli.app import cli_main

    job = ["export", "--config", str(TINY), "--trainer.default_root_dir", str(tmp_path / "run")]
    for value in ("5e-1", "1e-300", "2.5E-1"):
        check_command_line([*job, "--prune.ratio", value])
    with pytest.raises(OptionError, match=r"^--prune.ratio: ratio must be in \[0, 1\), got 5.0$"):
        check_command_line([*job, "--prune.ratio", "5e0"])
    config = tmp_path / "c.yaml"
    config.write_text(TINY.read_text().replace("ratio: 0.5", "ratio: 5e-1"))
    assert "ratio: 5e-1" in config.read_text()
    job[2] = str(config)
    check_command_line(job)
    monkeypatch.setattr(sys, "argv", ["lightprune"])
    with pytest.raises(SystemExit) as info:
        cli_main([*job, "--print_config"])
    assert info.value.code == 0 and "ratio: 0.5\n" in capsys.readouterr().out

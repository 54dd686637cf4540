"""The first pass refuses, in one line and exit status 2 before Lightning is imported, a value the parser would read
otherwise than written (YAML 1.1: ``020`` is 16), an empty item in a list of classes (``- `` in trainer.callbacks)
and a path that is not UTF-8 text; a parser message whose first line names only the key keeps its reason."""

from __future__ import annotations

import inspect
import sys

import pytest
from fixtures import REPO

from lightprune.cli.command_line_checks import check_command_line
from lightprune.cli.names import BOOL_OPTIONS, bool_option
from lightprune.cli.options import OptionError, split_addressed

TINY = REPO / "configs" / "aimer_tiny.yaml"


def _refused(argv: list[str], monkeypatch, capsys) -> str:
    """The first pass's line for ``lightprune ARGV`` (status 2; Lightning's command never called)."""
    from lightprune.cli import app, command

    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    monkeypatch.setattr(app, "main", lambda: pytest.fail("the first pass let it through"))
    monkeypatch.setattr(sys, "argv", ["lightprune", *argv])
    with pytest.raises(SystemExit) as info:
        command.main()
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == "" and err.count("\n") == 1, err
    return err.removeprefix("lightprune: error: ").rstrip("\n")


def _tiny(tmp_path, old: str, new: str) -> str:
    path = tmp_path / "job.yaml"
    text = TINY.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return str(path)


REFUSED = {
    "020": "020 is read as 16 (YAML 1.1 octal), not 20: write 20 (or 16, if octal 020 was meant)",
    "08": "08 is read as the text '08' (YAML 1.1 reads a leading 0 as octal, and 8 and 9 are no octal digits), not 8: "
          "write 8, or quote it ('08') for text",
    "0o20": "0o20 is read as the text '0o20' (YAML 1.1 has no 0o prefix), not 16 (YAML 1.2 octal): write 16, or quote "
            "it ('0o20') for text",
    "1:30": "1:30 is read as 90 (YAML 1.1 base 60), not the text '1:30': write 90, or quote it ('1:30') for text",
    "yes": "yes is read as true (YAML 1.1 boolean), not the text 'yes': write true for the boolean, or quote it "
           "('yes') for text",
    "off": "off is read as false (YAML 1.1 boolean), not the text 'off': write false for the boolean, or quote it "
           "('off') for text",
}


@pytest.mark.parametrize("literal", list(REFUSED))
def test_a_literal_yaml_1_1_reads_otherwise_is_refused_naming_file_line_and_readings(literal, tmp_path, monkeypatch,
                                                                                     capsys) -> None:
    config = _tiny(tmp_path, "num_experts: 16", f"num_experts: {literal}")
    line = _refused(["export", "--config", config, "--trainer.default_root_dir", str(tmp_path / "run")],
                    monkeypatch, capsys)
    assert line == f"config file {config!r}, line 9: model.init_args.tiny_overrides.num_experts: {REFUSED[literal]}"


@pytest.mark.parametrize("literal", ["0x10", "0b101", "1_000", "+5", "0020.5", "'020'", '"yes"', "20"])
def test_a_literal_both_readers_agree_on_is_taken(literal, tmp_path) -> None:
    config = _tiny(tmp_path, "num_experts: 16", f"num_experts: {literal}")
    check_command_line(["export", "--config", config, "--trainer.default_root_dir", str(tmp_path / "run")])


def test_yes_and_no_are_taken_in_a_true_false_option_only(tmp_path, monkeypatch, capsys) -> None:
    run = ["--trainer.default_root_dir", str(tmp_path / "run")]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_project.py").write_text("import lightning\n\n\nclass Mine(lightning.Callback):\n    pass\n")
    for fine in (("enable_checkpointing: false", "enable_checkpointing: no"),  # the trainer's
                 ("- class_path: lightprune.callbacks.Export", "- class_path: lightprune.callbacks.Export\n"
                  "      init_args: {overwrite: yes}"),  # a lightprune callback's
                 ("- class_path: lightprune.callbacks.Export", "- class_path: lightprune.callbacks.Export\n"
                  "    - class_path: my_project.Mine\n      init_args: {flag: on}")):  # a class it cannot type
        check_command_line(["export", "--config", _tiny(tmp_path, *fine), *run])
    config = _tiny(tmp_path, "criterion: aimer", "criterion: on")
    assert _refused(["export", "--config", config, *run], monkeypatch, capsys) == (
        f"config file {config!r}, line 20: trainer.callbacks[1].init_args.criterion: on is read as true (YAML 1.1 "
        "boolean), not the text 'on': write true for the boolean, or quote it ('on') for text")
    # the command line: an addressed option is read by lightprune (any type), a list or mapping by the parser as YAML
    assert split_addressed(["--prune.seed", "020", "--export.overwrite", "yes"])[1][0].value == 20  # as jsonargparse
    assert split_addressed(["--export.overwrite", "yes"])[1][0].value is True
    job = ["export", "--config", str(TINY), *run]
    assert _refused([*job, "--prune.seed", "0_20"], monkeypatch, capsys) == (
        "--prune.seed: 0_20 is read as 16 (YAML 1.1 octal), not 20: write 20 (or 16, if octal 0_20 was meant)")
    assert _refused([*job, "--model.init_args.tiny_overrides", "{num_experts: 020}"], monkeypatch, capsys) == (
        f"--model.init_args.tiny_overrides: num_experts: {REFUSED['020']}")


def test_the_bool_options_are_the_signatures_bool_parameters() -> None:
    import lightning.pytorch as pl

    import lightprune.callbacks
    import lightprune.data
    from lightprune.data.base import JsonlDataModule
    from lightprune.data.generated.qa import GeneratedQADataModule
    from lightprune.finetune import MoECausalLM

    def bools(function) -> frozenset[str]:
        return frozenset(p.name for p in inspect.signature(function).parameters.values() if "bool" in str(p.annotation))

    classes = {"MoECausalLM": MoECausalLM, "JsonlDataModule": JsonlDataModule,
               "GeneratedQADataModule": GeneratedQADataModule,
               **{name: getattr(lightprune.callbacks, name) for name in lightprune.callbacks.__all__},
               **{name: getattr(lightprune.data, name) for name in lightprune.data.__all__
                  if name.endswith(("DataModule", "Tokens"))}}
    assert set(BOOL_OPTIONS) == {"Trainer", "methods", *classes}
    assert BOOL_OPTIONS["Trainer"] == bools(pl.Trainer.__init__)
    assert BOOL_OPTIONS["methods"] == bools(pl.Trainer.fit) | bools(pl.Trainer.test) | bools(pl.Trainer.predict)
    for name, cls in classes.items():
        assert BOOL_OPTIONS[name] == bools(cls.__init__), name
    config = {"model": {"init_args": {}}, "trainer": {"callbacks": [{"class_path": "Export"}, {"class_path": "x.Y"}]}}
    assert bool_option(("model", "init_args", "sequential"), config) is True
    assert bool_option(("model", "init_args", "tiny_overrides", "a"), config) is False
    assert bool_option(("trainer", "callbacks", 0, "init_args", "atol"), config) is False
    assert bool_option(("trainer", "callbacks", 1, "init_args", "flag"), config) is None


@pytest.mark.parametrize("written", ["-", "- null", "- ~"])
def test_an_empty_item_of_a_list_of_classes_is_refused_naming_file_line_and_what_to_write(written, tmp_path,
                                                                                          monkeypatch, capsys) -> None:
    config = _tiny(tmp_path, "  callbacks:\n", f"  callbacks:\n    {written}\n")
    shown = {"-": "a '-' with nothing after it", "- null": "null", "- ~": "~"}[written]
    assert _refused(["export", "--config", config, "--trainer.default_root_dir", str(tmp_path / "run")], monkeypatch,
                    capsys) == (f"config file {config!r}, line 17: item 1 of trainer.callbacks is empty ({shown}); "
                                "write a class there (- class_path: lightprune.callbacks.Export) or remove the item")


def test_an_empty_item_of_the_loggers_or_on_the_command_line_is_refused(tmp_path, monkeypatch, capsys) -> None:
    config = _tiny(tmp_path, "logger: false", "logger:\n    - class_path: lightning.pytorch.loggers.CSVLogger\n    -")
    run = ["--trainer.default_root_dir", str(tmp_path / "run")]
    assert _refused(["export", "--config", config, *run], monkeypatch, capsys) == (
        f"config file {config!r}, line 15: item 2 of trainer.logger is empty (a '-' with nothing after it); write a "
        "class there (- class_path: package.module.Class) or remove the item")
    assert _refused(["export", "--config", str(TINY), *run, "--trainer.callbacks", "[ReportPage, null]"],
                    monkeypatch, capsys) == (
        "--trainer.callbacks: item 2 of trainer.callbacks is empty (null); write a class there (- class_path: "
        "lightprune.callbacks.Export) or remove the item")


BAD = "/tmp/no-such-lightprune-dir/ck\udcff\udcfe"  # the bytes 0xFF 0xFE, as Python holds a name that is not UTF-8


@pytest.mark.parametrize("option,what", [
    ("--model.init_args.checkpoint", "checkpoint directory"), ("--trainer.default_root_dir", "run directory"),
    ("--export.checkpoint_dir", "checkpoint directory"), ("--export.plan_path", "plan file"),
    ("--prune.output_dir", "output directory"), ("--export.output_dir", "output directory")])
def test_a_path_that_is_not_utf8_is_refused_naming_the_option(option, what, tmp_path, monkeypatch, capsys) -> None:
    job = ["export", "--config", str(REPO / "configs" / "aimer.yaml"), "--model.init_args.checkpoint", str(REPO),
           "--trainer.default_root_dir", str(tmp_path / "run")]
    assert _refused([*job, option, BAD], monkeypatch, capsys) == (
        f"{option}: {what} {BAD!r} is not UTF-8 text (byte 0xff): lightprune records paths in JSON; rename it")


def test_data_paths_that_are_not_utf8_are_refused_from_a_config_too(tmp_path) -> None:
    job = ["calibrate", "--config", str(REPO / "configs" / "reap.yaml"), "--model.init_args.checkpoint", str(REPO),
           "--trainer.default_root_dir", str(tmp_path / "run")]
    for argument, what in (("calibration", "calibration JSONL file"), ("tokenizer", "tokenizer directory")):
        with pytest.raises(OptionError) as info:
            check_command_line([*job, f"--data.init_args.{argument}", BAD])
        assert str(info.value).startswith(f"--data.init_args.{argument}: {what} {BAD!r} is not UTF-8 text")
    config = tmp_path / "cb.yaml"
    config.write_text("trainer:\n  callbacks:\n    - class_path: lightprune.callbacks.ExpertStats\n"
                      '      init_args: {output_dir: "/tmp/x\\udcff"}\n')
    with pytest.raises(OptionError, match=r"^--stats.output_dir: output directory '/tmp/x\\udcff' is not UTF-8 text"):
        check_command_line([*job, "--config", str(config)])


def test_a_parser_message_naming_only_the_key_keeps_its_reason() -> None:
    from lightprune.cli.errors import condense, first_line, lightning_problem

    message = ("Parser key \"model\":\n  'utf-8' codec can't encode characters in position 11-12: surrogates not "
               "allowed")
    assert condense(message) == ("Parser key \"model\": 'utf-8' codec can't encode characters in position 11-12: "
                                 "surrogates not allowed")
    assert lightning_problem("Bad config:\n\n  the reason\nmore", None) == "Bad config: the reason"
    assert first_line(["", "  one line  "], "x") == "one line"

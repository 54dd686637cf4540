"""The files a job reads (the model's checkpoint, the data module's JSONL files and tokenizer folder) are checked
by the console script's first pass, before Lightning is imported (cli.inputs through cli.command_line_checks)."""

from __future__ import annotations

import re

from pathlib import Path

import pytest
from fixtures import REPO

from lightprune.cli.command_line_checks import check_command_line
from lightprune.cli.options import OptionError


def test_the_command_line_pass_refuses_a_missing_local_checkpoint(tmp_path, monkeypatch) -> None:
    """A model checkpoint that can only be a local path (absolute, ./, ../, ~, two folders deep) and does not exist
    is refused before Lightning, from the command line or a config, the last given winning; a hub id, a testbed
    name, an existing folder, or a model given in a way the pass does not follow, are left to the parser."""
    from lightprune.cli.command_line_checks import check_command_line
    from lightprune.cli.options import OptionError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "missing.yaml").write_text("model:\n  class_path: lightprune.finetune.MoECausalLM\n"
                                           "  init_args:\n    checkpoint: ./gone/model\n")
    (tmp_path / "same_class.yaml").write_text("model:\n  class_path: lightprune.finetune.MoECausalLM\n")
    (tmp_path / "other_class.yaml").write_text("model:\n  class_path: my_project.MyModule\n")
    (tmp_path / "my_project.py").write_text("import lightning\n\n\nclass MyModule(lightning.LightningModule):\n"
                                            "    pass\n")  # read by the first pass, never imported
    job = ["export", "--config", str(REPO / "configs" / "aimer_tiny.yaml")]
    for bad in ("./gone", str(tmp_path / "gone"), "../gone/model", "a/b/c", "~/no-such-lightprune-ckpt"):
        for option in ("--model.init_args.checkpoint", "--model.checkpoint"):
            with pytest.raises(OptionError, match=f"checkpoint directory '{re.escape(bad)}' does not exist"):
                check_command_line([*job, option, bad])
    with pytest.raises(OptionError, match="'./gone/model' does not exist"):
        check_command_line([*job, "--config", "missing.yaml"])
    with pytest.raises(OptionError, match="'./gone' does not exist"):  # the same class again keeps its arguments
        check_command_line([*job, "--model.init_args.checkpoint", "./gone", "--config", "same_class.yaml"])
    for fine in (["--model.init_args.checkpoint", "./ckpt"], ["--model.init_args.checkpoint", str(tmp_path / "ckpt")],
                 ["--model.init_args.checkpoint", "Qwen/Qwen3-30B-A3B"], ["--model.init_args.checkpoint", "gpt2"],
                 ["--model.init_args.checkpoint", "testbed:text-small"],
                 ["--config", "missing.yaml", "--model.init_args.checkpoint", "./ckpt"],  # the last one given
                 ["--model.init_args.checkpoint", "./gone", "--config", "other_class.yaml"],  # another class
                 ["--model.init_args.checkpoint", "./gone", "--model", "other.yaml"]):
        check_command_line([*job, *fine])


def test_the_command_line_pass_refuses_missing_data_files_and_tokenizer_folders(tmp_path, monkeypatch) -> None:
    """configs/reap.yaml (TextJsonlDataModule): a JSONL split that is not a file and a tokenizer folder that is not
    a folder are refused before Lightning, all of them in one line, in the data module's own words; a source name,
    an existing file, a data module given another way, are left to the classes."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "calib.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "tok").mkdir()
    job = ["calibrate", "--config", str(REPO / "configs" / "reap.yaml"), "--model.init_args.checkpoint", str(REPO)]
    with pytest.raises(OptionError) as info:
        check_command_line([*job, "--data.init_args.tokenizer", "tok2", "--data.init_args.calibration", "c.jsonl",
                            "--data.init_args.val", "v.jsonl"])
    assert str(info.value) == (
        "--data.init_args.calibration: calibration JSONL file 'c.jsonl' does not exist; "
        "--data.init_args.val: val JSONL file 'v.jsonl' does not exist; "
        "--data.init_args.tokenizer: tokenizer directory 'tok2' does not exist (lightprune loads tokenizers from "
        "local directories only; nothing is downloaded)")
    (tmp_path / "image.yaml").write_text("data:\n  class_path: lightprune.data.ImageTextJsonlDataModule\n"
                                         "  init_args:\n    processor: ./proc\n    train: t.jsonl\n")
    with pytest.raises(OptionError, match=r"^--data.init_args.train: train JSONL file 't.jsonl' does not exist; "
                                          r"--data.init_args.processor: processor directory './proc' does not exist"):
        check_command_line([*job, "--config", "image.yaml"])
    for fine in (["--data.init_args.tokenizer", "tok", "--data.init_args.calibration", "calib.jsonl"],
                 ["--data.init_args.tokenizer", "testbed:text-small", "--data.init_args.calibration", "calib.jsonl"],
                 ["--data.init_args.calibration", "nope.jsonl", "--data", "lightprune.data.SyntheticTokens"],
                 ["--data.init_args.calibration", "nope.jsonl", "--data", "data.yaml"]):  # a file: not followed
        check_command_line([*job, *fine])


def test_a_config_that_is_no_config_is_refused_in_one_line(tmp_path, monkeypatch) -> None:
    """A --config that names no file (with the closest file of its folder), a folder, a file that is not UTF-8,
    not YAML, empty, only comments, or whose top level is not a mapping: refused before anything is built."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "quickstart.yaml").write_text("trainer: {}\n")
    files = {"empty.yaml": b"", "comments.yaml": b"# only\n# comments\n", "list.yaml": b"- a\n- b\n",
             "scalar.yaml": b"hello\n", "latin1.yaml": b"trainer:\n  default_root_dir: caf\xe9\n",
             "broken.yaml": b"trainer:\n  max_steps: [1\nmodel: x\n"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    cases = {
        "configs/quickstrt.yaml": "--config 'configs/quickstrt.yaml': no such file (did you mean "
                                  "'configs/quickstart.yaml'?)",
        "nowhere/x.yaml": "--config 'nowhere/x.yaml': no such file (no folder 'nowhere'; configs/ holds the recipes)",
        "configs": "--config 'configs' is a folder; give a config file (for example configs/quickstart.yaml)",
        "empty.yaml": "config file 'empty.yaml' is empty; a config is a mapping of options (trainer:, model:, data:, "
                      "...; configs/ holds the recipes)",
        "comments.yaml": "config file 'comments.yaml' is empty (comments only); a config is a mapping of options "
                         "(trainer:, model:, data:, ...; configs/ holds the recipes)",
        "list.yaml": "config file 'list.yaml' is not a mapping of options: its top level is a list",
        "scalar.yaml": "config file 'scalar.yaml' is not a mapping of options: its top level is a scalar ('hello')",
        "latin1.yaml": "config file 'latin1.yaml' is not UTF-8 text (byte 0xe9 at line 2, column 24)",
        "broken.yaml": "config file 'broken.yaml' is not YAML: expected ',' or ']', but got ':' (line 3, column 6)",
        "[1, 2]": "--config is not a mapping of options: its top level is a list",
        "": "--config needs a value: a YAML config file (configs/ holds the recipes)",
    }
    for value, message in cases.items():
        with pytest.raises(OptionError) as info:
            check_command_line(["export", "--config", value])
        assert str(info.value) == message
    with pytest.raises(OptionError, match="^-c 'configs/quickstrt.yaml': no such file"):
        check_command_line(["export", "-c=configs/quickstrt.yaml"])
    # the config's content given inline (as jsonargparse takes it, and lp.run_recipe gives a mapping) still passes
    check_command_line(["export", "--config", "trainer: {max_steps: 1}", "--config", '{"seed_everything": 1}',
                        "--config", "configs/quickstart.yaml"])


def test_a_run_directory_that_cannot_be_one_is_refused(tmp_path, monkeypatch) -> None:
    """trainer.default_root_dir that is a file, or under one (from the command line or a config, the last one
    given): refused before Lightning (it would fail only once the trainer is built)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "c.yaml").write_text("trainer:\n  default_root_dir: afile/run\n")
    job = ["export", "--config", str(REPO / "configs" / "aimer_tiny.yaml")]
    with pytest.raises(OptionError) as info:
        check_command_line([*job, "--trainer.default_root_dir", "afile"])
    assert str(info.value) == ("--trainer.default_root_dir: 'afile' is a file, not a folder; give a folder (an "
                               "existing one or one to create)")
    with pytest.raises(OptionError) as info:
        check_command_line([*job, "--config", "c.yaml"])
    assert str(info.value) == ("config file 'c.yaml': trainer.default_root_dir: 'afile/run' cannot be created: "
                               "'afile' is a file; give a folder elsewhere")
    check_command_line([*job, "--config", "c.yaml", "--trainer.default_root_dir", str(tmp_path / "run")])
    check_command_line([*job, "--trainer.default_root_dir", "afile", "--config", "c.yaml", "--print_config"])
    # a folder this user cannot write (root writes anywhere but on a read-only file system: os.access says so)
    import lightprune.cli.inputs as inputs

    (tmp_path / "ro").mkdir()
    real = inputs.os.access
    monkeypatch.setattr(inputs.os, "access",
                        lambda path, mode: Path(path).resolve() != tmp_path / "ro" and real(path, mode))
    for root, folder in (("ro", "ro"), ("ro/new/run", "ro")):
        with pytest.raises(OptionError) as info:
            check_command_line([*job, "--trainer.default_root_dir", root])
        assert str(info.value) == (f"--trainer.default_root_dir: {root!r} cannot be written: {folder!r} is read-only "
                                   "for this user (or on a read-only file system); give a folder elsewhere")
    check_command_line([*job, "--trainer.default_root_dir", str(tmp_path / "run")])


def test_a_run_directory_under_home_or_remote_is_read_as_lightning_reads_it(tmp_path, monkeypatch) -> None:
    """``~`` in trainer.default_root_dir is the home folder (Lightning expands it) and a URL is no local path: a
    file named '~' or 's3:' in the working directory made them refused, and so did a read-only working directory."""
    from lightprune.cli.inputs import root_dir_problem

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    (work / "~").write_text("a file named ~")
    (work / "s3:").write_text("a file named s3:")
    assert root_dir_problem("~/run") is None and root_dir_problem("s3://bucket/run") is None
    (home / "afile").write_text("x")
    assert root_dir_problem("~/afile/run") == (f"'~/afile/run' cannot be created: {str(home / 'afile')!r} is a "
                                               "file; give a folder elsewhere")
    assert root_dir_problem("~/afile") == "'~/afile' is a file, not a folder; give a folder (an existing one or one "\
                                          "to create)"
    from lightprune.cli import inputs

    real = inputs.os.access  # the working directory read-only: neither is in it
    monkeypatch.setattr(inputs.os, "access", lambda path, mode: Path(path).resolve() != work and real(path, mode))
    assert root_dir_problem("~/run") is None and root_dir_problem("s3://bucket/run") is None
    assert root_dir_problem("run") == ("'run' cannot be written: '.' is read-only for this user (or on a read-only "
                                       "file system); give a folder elsewhere")
    job = ["export", "--config", str(REPO / "configs" / "aimer_tiny.yaml")]
    check_command_line([*job, "--trainer.default_root_dir", "~/run"])
    check_command_line([*job, "--trainer.default_root_dir", "s3://bucket/run"])
    assert not (home / "run").exists()


def test_a_config_named_with_home_is_read_as_the_parser_reads_it(tmp_path, monkeypatch) -> None:
    """``--config=~/job.yaml`` (no shell expands ``~`` after ``=``) is the home folder's file, as jsonargparse reads
    it: it was not read at all (its ExpertPruning unseen: ``--prune.ratio`` refused as "the job has no ExpertPruning
    callback"), a typo said "no folder '~'", and a folder "no such file"."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    (home / "job.yaml").write_text((REPO / "configs" / "aimer_tiny.yaml").read_text())
    run = ["--trainer.default_root_dir", str(tmp_path / "run")]
    check_command_line(["export", "--config=~/job.yaml", "--prune.ratio", "0.3", *run])
    with pytest.raises(OptionError) as info:
        check_command_line(["export", "--config=~/job.yaml", "--prune.ratio", "1.5", *run])
    assert str(info.value).startswith("--prune.ratio: ratio must be in [0, 1), got 1.5")
    (home / "bad.yaml").write_text("trainer:\n  max_steps: 1\n  max_steps: 2\n")
    with pytest.raises(OptionError, match=r"^config file '~/bad.yaml': .*'max_steps'"):
        check_command_line(["export", "--config", "~/bad.yaml", *run])
    cases = {"~/jbo.yaml": f"--config '~/jbo.yaml': no such file (did you mean {str(home / 'job.yaml')!r}?)",
             "~": f"--config '~' is a folder; give a config file (for example {home / 'bad.yaml'}, "
                  f"{home / 'job.yaml'})"}
    for value, message in cases.items():
        with pytest.raises(OptionError) as info:
            check_command_line(["export", "--config", value])
        assert str(info.value) == message


BASE = "trainer:\n  max_steps: 2\n  logger: false\n"
UNBUILDABLE = [
    ("seed_everything: !!python/object/apply:os.system [echo hi]\n",
     "the tag '!!python/object/apply:os.system' at line 4, column 18 is not one YAML's safe loader builds; a config "
     "holds plain values (text, numbers, true/false, null, lists and mappings)"),
    ("ratio: !percent 50\n", "the tag '!percent' at line 4, column 8 is not one YAML's safe loader builds"),
    ("? [a, b]\n: 1\n", "the key at line 4, column 3 is a list or a mapping; a config's keys are option names"),
    ("---\ntrainer: {}\n", " holds more than one YAML document (the second starts at line 4, column 1); a config is "
     "one document"),
    ("model: *nowhere\n", " is not YAML lightprune reads: found undefined alias 'nowhere' (line 4, column 8)"),
    ("data: x\x00y\n", " is not YAML: unacceptable character #x0000 at line 4 (special characters are not allowed)"),
]


@pytest.mark.parametrize("tail,message", UNBUILDABLE, ids=["python-tag", "custom-tag", "complex-key", "two-documents",
                                                           "undefined-alias", "nul"])
def test_yaml_the_safe_loader_cannot_build_is_refused_naming_the_file_and_line(tail, message, tmp_path) -> None:
    """What jsonargparse reported ~6 s in as "Problems parsing config: ..." (no file, often no line) is one line of
    the first pass, before Lightning loads; an impossible date is text in both readers and passes here."""
    from lightprune.cli.inputs import load_config

    path = tmp_path / "job.yaml"
    path.write_text(BASE + tail)
    with pytest.raises(ValueError) as info:
        load_config(str(path), "--config")
    assert str(info.value).startswith(f"config file {str(path)!r}") and message in str(info.value)
    with pytest.raises(OptionError) as info:  # the same line from the whole first pass, inline content too
        check_command_line(["export", "--config", BASE + tail, "--trainer.default_root_dir", str(tmp_path / "run")])
    assert str(info.value).startswith("--config") and message.split(" (line")[0].split(" at line")[0] in str(info.value)
    path.write_text(BASE + "data:\n  day: 2024-02-30\n")
    assert load_config(str(path), "--config") == (str(path), {"trainer": {"max_steps": 2, "logger": False},
                                                              "data": {"day": "2024-02-30"}})

"""The deployment page's shell commands run from where it says to run them, the repository root: its lm_eval task
finds its data from there (lm_eval reads a task's data_files relative to data_dir and that relative to the working
directory, not to the task file), its lm_eval command runs there (when lm_eval is installed; the ``eval`` extra),
and its convert-gguf command writes under outputs/ (tests/integration/deploy/test_gguf.py runs it)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fixtures import REPO
from fixtures.deploy import PAGE, export_testbed, page_commands

from lightprune.cli.convert_gguf import parser

pytestmark = pytest.mark.exhaustive  # the exhaustive tier only: the deployment page's commands, end to end


def _command(*program: str) -> list[str]:
    """The page's one command that starts with the words ``program`` (environment assignments before it dropped)."""
    found = []
    for words in page_commands():
        while words and "=" in words[0] and not words[0].startswith("-"):
            words = words[1:]
        if words[:len(program)] == list(program):
            found.append(words)
    (words,) = found
    return words


def _option(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def test_the_page_says_where_its_commands_run() -> None:
    text = " ".join(PAGE.read_text().split())
    assert "The commands of this page run from the repository root" in text
    assert "outputs/quickstart/model" in text and "lightprune calibrate --config configs/quickstart.yaml" in text
    assert "pip install -e '.[eval]' -c constraints.txt" in text  # lm_eval is not in the README's first install


def test_the_lm_eval_task_finds_its_data_from_the_repository_root() -> None:
    from lightprune.callbacks.evaluate import load_lm_eval_task

    words = _command("lm_eval")
    folder, task = REPO / _option(words, "--include_path"), _option(words, "--tasks")
    (file,) = [f for f in sorted(folder.glob("*.yaml")) if yaml.safe_load(f.read_text()).get("task") == task]
    kwargs = yaml.safe_load(file.read_text())["dataset_kwargs"]
    data_dir = REPO / kwargs.get("data_dir", "")  # as lm_eval (datasets) reads it, from the working directory
    assert kwargs["data_files"] and all((data_dir / name).is_file() for name in kwargs["data_files"].values())
    # lightprune's reader (Evaluate's lm_eval_tasks) reads them relative to the task file: the same files
    assert load_lm_eval_task(file)["dataset_kwargs"]["data_files"] == \
        {split: str((data_dir / name).resolve()) for split, name in kwargs["data_files"].items()}


def test_the_convert_gguf_command_writes_under_outputs() -> None:
    words = _command("lightprune", "convert-gguf")
    args = parser().parse_args(words[2:])
    assert args.export == "outputs/quickstart/model"
    assert Path(args.outfile).parts[0] == "outputs" and Path(args.outfile).suffix == ".gguf"


def test_the_pages_lm_eval_command_runs_from_the_repository_root(testbed_root, tmp_path) -> None:
    """The command as the page writes it, in a folder holding what it needs of the repository root (lm_eval comes
    with the dev extra: without it this skips, and fails under CI)."""
    if importlib.util.find_spec("lm_eval") is None:
        why = "lm_eval is not installed (the eval extra; pip install -e '.[dev]' brings it)"
        (pytest.fail if os.environ.get("CI") else pytest.skip)(why)
    words = _command("lm_eval")
    include = _option(words, "--include_path")
    shutil.copytree(REPO / include, tmp_path / include)
    export_testbed(testbed_root, tmp_path / _option(words, "--model_args").removeprefix("pretrained="))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "datasets")}
    done = subprocess.run([sys.executable, "-m", "lm_eval", *words[1:]], cwd=tmp_path, capture_output=True,
                          text=True, check=False, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "lightprune_tiny_choice" in done.stdout and "|acc" in done.stdout, done.stdout[-2000:]

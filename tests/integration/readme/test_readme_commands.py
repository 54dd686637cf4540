"""Every `lightprune` command the README and the documentation pages (docs/) show names configs that exist and
options lightprune accepts (checked as the console script checks them before it loads Lightning), so a renamed
option or config cannot rot there."""

from __future__ import annotations

import re
import shlex

import pytest
from fixtures import REPO

from lightprune.cli.command_line_checks import check_command_line
from lightprune.cli.options import OptionError

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
_BLOCKS = [block for page in PAGES for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S)]
COMMANDS = []
for _block in _BLOCKS:
    for _line in _block.replace("\\\n", " ").splitlines():
        for _part in _line.split("&&"):
            words = shlex.split(_part, comments=True)
            # convert-gguf has no config: tests/integration/deploy/test_deployment_page.py checks it
            if words[:1] == ["lightprune"] and words[1:2] != ["convert-gguf"]:
                COMMANDS.append([w for w in words[1:] if w != "..."])  # "...": the page leaves out the job's options


def test_the_readme_shows_commands() -> None:
    assert len(COMMANDS) >= 8
    assert {words[0] for words in COMMANDS} >= {"fit", "calibrate", "export"}


@pytest.mark.parametrize("words", COMMANDS, ids=[" ".join(w)[:60] for w in COMMANDS])
def test_readme_command_is_accepted(words, monkeypatch, tmp_path) -> None:
    # run where nothing is (the checkout's outputs/ may hold what the README's own commands left there): the
    # repository's files the command names (its configs) by their absolute paths
    monkeypatch.chdir(tmp_path)
    configs = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("--config", "-c")]
    assert configs and all((REPO / c).is_file() for c in configs), configs
    words = [str(REPO / w) if w in configs else w for w in words]
    # the reader's own files (a checkpoint folder, JSONL data): they exist where the command runs, not here
    (tmp_path / "rows.jsonl").write_text('{"text": "x"}\n')
    own = {w: str(REPO) if not w.endswith(".jsonl") else str(tmp_path / "rows.jsonl") for w in words
           if w == "CKPT" or w.startswith("/path/") or (w.endswith(".jsonl") and not (REPO / w).is_file())}
    # as shown, the first pass refuses what it cannot find (CKPT as the model's may be a hub id: left to the loader)
    if any(w != "CKPT" or words[i - 1].startswith("--data") for i, w in enumerate(words) if w in own):
        with pytest.raises(OptionError, match="does not exist"):
            check_command_line(words)
    words = [own.get(w, w) for w in words]
    check_command_line(words)


def test_every_command_that_runs_as_shown_has_its_recipe_run_by_a_test() -> None:
    """A command without placeholders (no CKPT, no user data) runs as shown on a fresh machine: its config is run
    end to end by the recipe tests (on the micro testbeds, a few steps)."""
    recipes = "\n".join(p.read_text() for p in (REPO / "tests" / "integration").rglob("test_*.py"))
    runnable = {words[words.index("--config") + 1] for words in COMMANDS
                if not any(w in ("CKPT", "...") or w.endswith(".jsonl") or w.startswith("/path") for w in words)}
    assert runnable >= {"configs/quickstart.yaml", "configs/reap_testbed.yaml", "configs/mwop.yaml"}
    missing = sorted(c for c in runnable if f'"{c}"' not in recipes)
    assert not missing, f"README commands whose config no integration test runs: {missing}"


def test_every_script_the_pages_run_exists() -> None:
    """`python scripts/NAME.py` in a bash block of the README or docs/ names a script of the repository."""
    scripts = {m for block in _BLOCKS for m in re.findall(r"python (scripts/[\w/.-]+\.py)", block)}
    assert "scripts/fetch_llama_cpp.py" in scripts
    assert sorted(s for s in scripts if not (REPO / s).is_file()) == []

"""Checkpoint sources: a prefix resolves to a local folder; unknown names fail at once, naming the choices."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lightprune.core import sources
from lightprune.core.sources import check_checkpoint_name, register_source, resolve_checkpoint


def test_a_registered_source_checks_and_resolves(tmp_path: Path, monkeypatch) -> None:
    sources.sources()  # the entry points' sources go into the registry itself, not into this test's copy
    monkeypatch.setattr(sources, "_SOURCES", dict(sources._SOURCES))
    built = []

    def check(name: str) -> None:
        if name != "mine:a":
            raise ValueError(f"unknown {name!r}; choose 'mine:a'")

    def resolve(name: str) -> Path:
        built.append(name)
        return tmp_path / "a"

    register_source("mine:", check, resolve)
    check_checkpoint_name("mine:a")
    assert built == []  # checking never builds
    assert resolve_checkpoint("mine:a") == tmp_path / "a" and built == ["mine:a"]
    with pytest.raises(ValueError, match="unknown 'mine:b'; choose 'mine:a'"):
        check_checkpoint_name("mine:b")
    with pytest.raises(ValueError, match=r"unknown checkpoint source 'other:' in 'other:x'; registered sources: "
                                         r"\['mine:', 'testbed:'\]"):
        check_checkpoint_name("other:x")
    with pytest.raises(ValueError, match="ends with ':'"):
        register_source("mine", check, resolve)


def test_paths_are_paths(tmp_path: Path) -> None:
    odd = tmp_path / "run:1"
    odd.mkdir()
    check_checkpoint_name(str(odd))  # an existing folder whose name holds a colon
    assert resolve_checkpoint(str(odd)) == odd
    with pytest.raises(FileNotFoundError, match="checkpoint directory .*missing.* does not exist"):
        check_checkpoint_name(str(tmp_path / "missing"))


@pytest.mark.exhaustive
def test_the_testbed_source_comes_from_its_entry_point() -> None:
    # a fresh process that never imported lightprune.testbed still resolves 'testbed:' names
    code = ("import sys; from lightprune.core.sources import sources; s = sources(); "
            "print('testbed:' in s, 'lightprune.testbed' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True"]


def test_a_tokenizer_and_a_processor_take_a_checkpoint_source_name(monkeypatch, testbed_root) -> None:
    """`--data.init_args.tokenizer testbed:text-micro` loads the testbed's own tokenizer (as the checkpoint name
    does for the model); an unknown source is named."""
    from transformers import AutoTokenizer

    from lightprune.data.image_text import load_processor
    from lightprune.data.text import load_tokenizer
    from lightprune.testbed import resolve_testbed

    monkeypatch.setenv("LIGHTPRUNE_CACHE", str(testbed_root))
    folder = resolve_testbed("testbed:text-micro")
    text = "def f(x):\n    return x + 1  # a comment"
    want = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)(text)["input_ids"]
    assert load_tokenizer("testbed:text-micro")(text)["input_ids"] == want
    with pytest.raises(ValueError, match="unknown checkpoint source 'nope:'"):
        load_tokenizer("nope:thing")
    with pytest.raises(ValueError, match="unknown checkpoint source 'nope:'"):
        load_processor("nope:thing")

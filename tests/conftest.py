"""Shared pytest setup: offline hub, the ``fixtures`` helpers importable, tiny models built once per session.

Layout: ``unit/<folder>/`` mirrors ``src/lightprune/<folder>/``; ``integration/`` holds the CLI, recipe and
multi-process tests; ``fixtures/`` the helpers, data files and the CPU DeepSpeed strategy.

``tiny(family, seed=0, **overrides)`` returns a deep copy of a cached tiny model, so a test may
mask, prune or train it freely without paying for the build again or leaking into other tests.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# tests/unit/<folder>/ and tests/integration/<folder>/ import the shared helpers as ``fixtures`` (tests/fixtures)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--exhaustive", action="store_true", default=False,
                     help="run the exhaustive tier too: every family on every path, the subprocess and end-to-end "
                          "runs (what CI and the README's test command run); without it, the quick tier "
                          "(tests/fixtures/tiers.py)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without ``--exhaustive``, run the quick tier: what :func:`fixtures.tiers.quick_tier` keeps."""
    if config.getoption("--exhaustive"):
        return
    from fixtures.tiers import quick_tier

    kept, deselected = quick_tier(items)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def pytest_report_header(config: pytest.Config) -> str:
    return ("tier: exhaustive (every test)" if config.getoption("--exhaustive")
            else "tier: quick (pytest --exhaustive runs every test)")


def _freeze(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


@pytest.fixture(autouse=True)
def _torch_global_modes():
    """Give each test torch's global modes as the previous one found them: a ``Trainer(deterministic=True)`` turns
    deterministic algorithms on for the rest of the process and would change what later tests run."""
    import torch

    modes = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.get_num_threads())
    yield
    torch.use_deterministic_algorithms(modes[0], warn_only=modes[1])
    torch.set_num_threads(modes[2])


#: what tools write into any checkout they run in (Python's bytecode, pytest's own cache, an editable install)
_TOOL_FILES = ("__pycache__", ".pytest_cache", ".egg-info", ".import_linter_cache")


def _checkout_state(repo: Path) -> set[str] | None:
    """The checkout's changed, untracked and ignored paths as ``git status`` lists them (None outside a git
    checkout), without what tools write into any checkout (:data:`_TOOL_FILES`)."""
    import subprocess

    try:
        done = subprocess.run(["git", "status", "--porcelain=v1", "-z", "--ignored", "--untracked-files=all"],
                              cwd=repo, capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    entries = done.stdout.decode("utf-8", "replace").split("\0")
    return {e for e in entries if e and not any(part in e for part in _TOOL_FILES)}


@pytest.fixture(scope="session", autouse=True)
def _checkout_untouched():
    """A test never writes into the checkout (nor depends on what a user's runs left there, such as outputs/):
    temporary directories only. The session fails at its end when the checkout's files changed while it ran."""
    repo = Path(__file__).resolve().parents[1]
    before = _checkout_state(repo)
    yield
    after = _checkout_state(repo) if before is not None else None
    if after is not None and after != before:
        changed = sorted(after - before) + [f"(gone) {e}" for e in sorted(before - after)]
        pytest.fail(f"the tests changed the checkout {repo}: " + ", ".join(changed[:20]), pytrace=False)


@pytest.fixture(scope="session")
def tiny_cache():
    """{(family, seed, overrides): model}, built lazily; hand out copies only (see ``tiny``)."""
    return {}


@pytest.fixture(scope="session")
def tiny(tiny_cache):
    """Factory: ``tiny(family, seed=0, **overrides)`` -> a fresh deep copy of a cached tiny model."""
    from lightprune.testing.tiny import tiny_model

    def make(family: str, seed: int = 0, **overrides):
        key = (family, seed, _freeze(overrides))
        if key not in tiny_cache:
            tiny_cache[key] = tiny_model(family, seed=seed, **overrides)
        return copy.deepcopy(tiny_cache[key])

    return make


@pytest.fixture(scope="session")
def testbed_root(tmp_path_factory):
    """A cache root holding the micro text testbed (corpus, tokenizer, trained model), built once per session.

    Tests that run a job on ``testbed:text-micro`` point ``LIGHTPRUNE_CACHE`` here instead of training
    the testbed again; they must not write into it (the cache is keyed by spec digest, so they do not).
    """
    from lightprune.testbed import text_testbed

    root = tmp_path_factory.mktemp("testbeds")
    text_testbed("micro", root, progress=False)
    return root

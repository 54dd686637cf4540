"""The documentation site builds with every warning an error (mkdocs --strict: a broken link, a page missing from
the navigation, a docstring that names a parameter the signature does not have), and every page is in it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fixtures import REPO

pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]'; the dev extra brings it)")


def test_the_site_builds_strictly_with_every_page(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
                          check=False, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    pages = {p.relative_to(REPO / "docs").with_suffix("") for p in (REPO / "docs").rglob("*.md")}
    built = {p.parent.relative_to(tmp_path / "site") for p in (tmp_path / "site").rglob("index.html")}
    missing = sorted(str(p) for p in pages if (p if p.name != "index" else p.parent) not in built)
    assert not missing, missing

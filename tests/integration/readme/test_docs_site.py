"""The documentation site builds with every warning an error (mkdocs --strict: a broken link, a page missing from
the navigation, a docstring that names a parameter the signature does not have), and every page is in it. The API
reference renders every public name of ``lightprune`` once, docs/python-api.md links to each, and the reference
renders nothing its module keeps private (outside the module's ``__all__``). One strict build serves every test of
this file."""

from __future__ import annotations

import html
import importlib
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from fixtures import REPO

pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]'; the dev extra brings it)")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once with ``mkdocs build --strict``."""
    site_dir = tmp_path_factory.mktemp("docs") / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
                          cwd=REPO, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
                          check=False, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return site_dir


def inventory(site: Path) -> dict[str, tuple[str, str, str]]:
    """Every name the site's objects.inv lists: name -> (role, page, anchor). An object rendered on a page is its
    own anchor (priority 1); the other names it is known by (where it is defined, where it is imported) point to
    that anchor."""
    header = (site / "objects.inv").read_bytes().split(b"\n", 4)
    names = {}
    for row in zlib.decompress(header[4]).decode().splitlines():
        name, role, _priority, uri = row.split(" ", 4)[:4]
        page, _, anchor = uri.partition("#")
        names[name] = (role, page, anchor.replace("$", name) if anchor else name)
    return names


def rendered_module_members(site: Path) -> dict[str, object]:
    """Each object rendered at module level (not a module, not a class member): its anchor -> the object."""
    members = {}
    for name, (role, _page, anchor) in inventory(site).items():
        if name != anchor or role == "py:module":
            continue
        parent, _, attr = name.rpartition(".")
        try:
            module = importlib.import_module(parent)
        except ImportError:  # a class's member
            continue
        members[name] = (module, attr)
    return members


def test_the_site_builds_strictly_with_every_page(site) -> None:
    pages = {p.relative_to(REPO / "docs").with_suffix("") for p in (REPO / "docs").rglob("*.md")}
    built = {p.parent.relative_to(site) for p in site.rglob("index.html")}
    missing = sorted(str(p) for p in pages if (p if p.name != "index" else p.parent) not in built)
    assert not missing, missing


def test_every_public_name_is_rendered_once_on_a_reference_page_and_linked_from_the_api_page(site) -> None:
    import lightprune

    names = inventory(site)
    members = rendered_module_members(site)
    api_page = (site / "python-api" / "index.html").read_text()
    problems = []
    for public in sorted(set(lightprune.__all__) - {"__version__"}):
        obj = getattr(lightprune, public)
        known = {f"{obj.__module__}.{obj.__qualname__}", f"{lightprune._LAZY[public]}.{public}"}
        pages = {names[n][1] for n in known if n in names}
        anchors = [a for a, (module, attr) in members.items() if getattr(module, attr, None) is obj]
        if not any(page.startswith("reference/") for page in pages):
            problems.append(f"{public}: on no reference page ({sorted(known)} not in objects.inv)")
        elif len(anchors) != 1:
            problems.append(f"{public}: rendered {len(anchors)} times {anchors}")
        elif f'#{anchors[0]}"' not in api_page:
            problems.append(f"{public}: docs/python-api.md does not link to it ({anchors[0]})")
    assert not problems, problems


def test_the_reference_renders_only_the_names_of_each_modules_all(site) -> None:
    problems = []
    for anchor, (module, attr) in rendered_module_members(site).items():
        exported = getattr(module, "__all__", None)
        if exported is None or attr not in exported:
            problems.append(f"{anchor}: not in {module.__name__}.__all__")
    for name, (role, _page, anchor) in inventory(site).items():
        if role == "py:module" and name == anchor and not hasattr(importlib.import_module(name), "__all__"):
            problems.append(f"{name}: rendered, without an __all__ to say what is public")
    assert not problems, problems



ROLE = re.compile(r":(func|class|meth|attr|mod|data|exc|obj):(?=\S)")


def test_no_page_shows_a_literal_rest_role(site) -> None:
    """A docstring's cross-reference is a link (or code), never the raw role mkdocstrings leaves as text."""
    found = []
    for page in sorted(site.rglob("*.html")):
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
        found += [f"{page.relative_to(site)}: ...{text[max(0, m.start() - 60):m.end() + 60]!r}..."
                  for m in ROLE.finditer(text)]
    assert not found, found[:20]

"""The package's shape: import-linter's contracts hold, no module imports itself through others (imports
inside functions count), and every folder says what it is for and what it may import."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys

import pytest
from fixtures import REPO

SRC = REPO / "src" / "lightprune"


def _module_name(path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """{module: lightprune modules it imports anywhere in its file}, by reading the source (no import)."""
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules and "." in target:
                    target = target.rpartition(".")[0]
                if target in modules and target != name:
                    found.add(target)
        graph[name] = found
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every module that reaches itself, with one path back (depth-first over the import graph)."""
    cycles = []
    for start in sorted(graph):
        stack, seen = [(start, (start,))], set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    cycles.append(" -> ".join(path + (start,)))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + (nxt,)))
    return cycles


def test_the_cycle_search_finds_cycles_and_only_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a -> b -> c -> a", "b -> c -> a -> b",
                                                                       "c -> a -> b -> c"]
    assert _cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_no_module_imports_itself_through_others() -> None:
    graph = _imports()
    assert len(graph) > 100 and "lightprune.width.kernels.path_attention" in graph  # the walk found the package
    assert "lightprune.width.paths" in graph["lightprune.width.kernels.intervals"]
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(cycles[:10])


def test_import_linter_contracts_hold() -> None:
    lint = shutil.which("lint-imports")
    if lint is None:
        pytest.fail("lint-imports is missing: pip install -e '.[dev]' installs import-linter")
    done = subprocess.run([lint, "--config", str(REPO / "pyproject.toml"), "--no-cache"], cwd=REPO,
                          capture_output=True, text=True)  # no cache folder written into the checkout
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "BROKEN" not in done.stdout and "3 kept, 0 broken" in done.stdout


@pytest.mark.parametrize("package", sorted(p.parent.relative_to(SRC).as_posix() for p in SRC.rglob("__init__.py")
                                           if p.parent != SRC))
def test_every_folder_says_what_it_is_for_and_may_import(package: str) -> None:
    doc = ast.get_docstring(ast.parse((SRC / package / "__init__.py").read_text()))
    assert doc, f"src/lightprune/{package}/__init__.py has no docstring"
    assert "may import" in doc.lower(), f"src/lightprune/{package}/__init__.py does not say what it may import"


def test_import_lightprune_stays_light() -> None:
    code = "import sys, lightprune; print(sorted(m for m in ('torch', 'lightning', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

"""Papers are cited by title, arXiv id where known, and section: no source file or page refers to a paper by a
private number, or to notes kept outside the repository, which a reader of the repository cannot follow."""

from __future__ import annotations

import re
from pathlib import Path

from fixtures import REPO

#: what a reader cannot follow (a paper's private number, notes outside the repository); case-insensitive, so a
#: sentence that starts with one counts too
UNFOLLOWABLE = re.compile(r"\bpaper 00[0-9]\b|\(00[0-9]\)|METHODS\.md|DESIGN\.md|TESTBED\.md|\.\./shared",
                          re.IGNORECASE)

#: generated from the measured results, rewritten whenever they are
GENERATED = {REPO / "docs" / "RESULTS.md"}

#: lines the check must find, joined at run time so that neither this file nor its bytecode holds one whole
PLANTED = tuple("".join(pieces) for pieces in (
    ("As in paper ", "002, appendix D.5."), ("Paper ", "003's weight score"), ("MAEP (", "000)"),
    ("see METHODS", '.md, "Ranking"'), ("see DESIGN", ".md"), ("TESTBED", ".md notes"), ("../", "shared/papers")))


def _scanned() -> list[Path]:
    """Every .py file under src/ and scripts/, every .md page under docs/ but the generated one, and README.md."""
    files = [p for folder in ("src", "scripts") for p in sorted((REPO / folder).rglob("*.py"))]
    files += [p for p in sorted((REPO / "docs").rglob("*.md")) if p not in GENERATED]
    return files + [REPO / "README.md"]


def unfollowable(paths: list[Path]) -> list[str]:
    """``path:line: text`` for every line of ``paths`` that :data:`UNFOLLOWABLE` matches."""
    found = []
    for path in paths:
        name = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if UNFOLLOWABLE.search(line):
                found.append(f"{name}:{number}: {line.strip()}")
    return found


def test_the_scan_covers_sources_scripts_docs_and_the_readme() -> None:
    names = {p.relative_to(REPO).as_posix() for p in _scanned()}
    assert "README.md" in names and "docs/RESULTS.md" not in names
    assert {"src/lightprune/__init__.py", "scripts/quality_table.py", "docs/guides/mwop.md"} <= names


def test_every_citation_can_be_followed() -> None:
    found = unfollowable(_scanned())
    assert not found, ("cite the paper by title, arXiv id where known, and section (or the docs/ page that "
                       "documents a convention) instead of:\n" + "\n".join(found))


def test_the_check_names_file_and_line_of_each_planted_reference(tmp_path: Path) -> None:
    clean = tmp_path / "clean.md"
    clean.write_text('MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), appendix D.5;\n'
                     "papers 0.002 apart, (1.000), 2000 and METHODS are not references.\n", encoding="utf-8")
    assert unfollowable([clean]) == []
    for text in PLANTED:
        planted = tmp_path / "planted.py"
        planted.write_text(f'"""A module.\n\n{text}\n"""\n', encoding="utf-8")
        assert unfollowable([clean, planted]) == [f"{planted}:3: {text}"], text

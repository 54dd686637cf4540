"""Every ```python block of the README and of the documentation pages (docs/) runs as written (on the embedded
tiny models), so the documentation cannot rot."""

from __future__ import annotations

import re

import pytest
from fixtures import REPO

pytestmark = pytest.mark.exhaustive  # the exhaustive tier only: every Python block of the documentation, end to end


PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FOUND = [(page.relative_to(REPO), block) for page in PAGES
         for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S)]
BLOCKS = [block for _, block in FOUND]


def test_the_documentation_has_python_blocks() -> None:
    assert len(BLOCKS) >= 5
    assert any(str(page) == "README.md" for page, _ in FOUND)


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"{page}-{i}" for i, (page, _) in enumerate(FOUND)])
def test_documentation_python_block_runs(index, tmp_path, monkeypatch) -> None:
    from lightprune.experts.criteria import registry as criteria
    from lightprune.experts.criteria.registry import STATISTICS
    from lightprune.models import FAMILIES, unregister_family
    from lightprune.width.scorers import WIDTH_SCORERS

    monkeypatch.chdir(tmp_path)  # blocks write plan.json, out/
    block = BLOCKS[index]
    families_before = dict(FAMILIES)
    namespace = {"__name__": f"readme_block_{index}"}
    try:
        with criteria.CRITERIA.restoring(), STATISTICS.restoring(), WIDTH_SCORERS.restoring():
            for name in re.findall(r'@register_criterion\("(\w+)"\)', block):  # a name a test may hold: the snippet's
                if name in criteria.CRITERIA:                                   # own
                    criteria.unregister_criterion(name)
            exec(compile(block, f"{FOUND[index][0]} python block {index}", "exec"), namespace)
    finally:
        for model_type in set(FAMILIES) - set(families_before):
            unregister_family(model_type)
    if "plan" in namespace:  # the pruning snippets end in a plan with experts or paths to keep
        assert namespace["plan"] is not None

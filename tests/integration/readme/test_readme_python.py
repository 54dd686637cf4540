"""Every ```python block of the README runs as written (on the embedded tiny models), so the README cannot rot."""

from __future__ import annotations

import re

import pytest
from fixtures import REPO

BLOCKS = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)


def test_the_readme_has_python_blocks() -> None:
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs(index, tmp_path, monkeypatch) -> None:
    from lightprune.experts.calibration.registry import STATISTICS
    from lightprune.experts.criteria import registry as criteria
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
            exec(compile(block, f"README.md python block {index}", "exec"), namespace)
    finally:
        for model_type in set(FAMILIES) - set(families_before):
            unregister_family(model_type)
    if "plan" in namespace:  # the pruning snippets end in a plan with experts or paths to keep
        assert namespace["plan"] is not None

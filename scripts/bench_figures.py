"""The figures every benchmark script writes with ``--json`` (what ``collect_benchmarks.py`` merges).

Kept beside the scripts, not in the package: a benchmark imports it without importing Lightning.
"""

from __future__ import annotations

import json
import operator
from pathlib import Path
from typing import Any

__all__ = ["check", "write_json"]

_OPS = {"<=": operator.le, ">=": operator.ge, "==": operator.eq, "<": operator.lt, ">": operator.gt}


def check(name: str, value: Any, target: Any = None, op: str | None = None, reference: Any = None,
          reference_name: str | None = None, note: str = "") -> dict[str, Any]:
    """One figure: a measured value and, when it has a target, ``value <op> target`` as PASS / FAIL."""
    if target is not None and op not in _OPS:
        raise ValueError(f"op must be one of {list(_OPS)} when a target is given, got {op!r}")
    passed = None if target is None else bool(_OPS[op](value, target))
    return {"name": name, "value": value, "target": target, "op": op, "passed": passed, "reference": reference,
            "reference_name": reference_name, "note": note}


def write_json(path: Path | None, figures: dict[str, Any]) -> None:
    """Write ``figures`` to ``path`` (parents created); nothing when ``path`` is None."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=2) + "\n")

"""The benchmark figures as a Markdown section: `benchmarks_markdown`.

Input: the JSON of ``scripts/collect_benchmarks.py``, ``{name: figures, "machine": {...}, "commands": {name:
command line}}``, where each bench's figures (its ``--json`` output) carry:

- ``title``, ``what`` (one sentence), ``quick``, ``torch_threads``, ``repeats``, ``shapes`` (a dict);
- ``checks``: a list of ``{"name", "value", "target", "op", "passed", "reference", "reference_name", "note"}``,
  one per printed ratio or figure; ``target`` / ``op`` / ``passed`` are ``None`` for figures without a target;
- ``times_s``: ``{pass: {"median", "min"}}`` (optional); ``passed``: every judged check passed (``None``: none);
- any other keys (e.g. ``bytes``, ``params``) are listed as further figures.

A bench that failed to run is ``{"error", "exit_code", "stderr_tail"}`` and is rendered as such.
"""

from __future__ import annotations

from typing import Any

__all__ = ["benchmarks_markdown", "format_value"]

_RESERVED = {"machine", "commands"}
_SHOWN = {"benchmark", "title", "what", "quick", "torch_threads", "torch_version", "repeats", "shapes", "times_s",
          "checks", "passed", "exit_code", "seconds"}
_VERDICT = {True: "PASS", False: "FAIL", None: ""}


def format_value(value: Any) -> str:
    """Numbers as the tables print them: ints with thousands separators, floats to 4 significant digits."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    return str(value)


def _cell(text: Any) -> str:
    """A table cell: pipes escaped, one line, square brackets escaped (Markdown would read ``[a, b]`` beside
    another bracket as a reference link)."""
    return str(text).replace("|", "\\|").replace("\n", " ").replace("[", "\\[").replace("]", "\\]")


def _inline(value: Any) -> str:
    """A dict as ``key value, ...`` (nested dicts as ``key: (...)``, ``None`` values left out), anything else
    formatted."""
    if isinstance(value, dict):
        parts = [f"{k}: ({_inline(v)})" if isinstance(v, dict) else f"{k} {_inline(v)}" for k, v in value.items()
                 if v is not None]
        return ", ".join(parts)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    return format_value(value)


def _target(check: dict) -> str:
    if check.get("target") is None:
        return ""
    return f"{check.get('op') or ''} {format_value(check['target'])}".strip()


def _reference(check: dict) -> str:
    if check.get("reference") is None:
        return ""
    label = check.get("reference_name")
    return f"{format_value(check['reference'])}" + (f" ({label})" if label else "")


def _bench(name: str, figures: dict, command: str | None) -> list[str]:
    title = figures.get("title") or name
    lines = [f"### {title} (`{name}`)", ""]
    if "error" in figures:
        code = figures.get("exit_code")
        lines += [f"**Did not run to the end**: {figures['error']}" + ("" if code is None else f" (exit code {code})")
                  + ".", ""]
        tail = "\n".join(str(figures.get("stderr_tail") or "").strip().splitlines()[-20:])
        if tail:
            lines += ["```", tail, "```", ""]
    else:
        if figures.get("what"):
            lines += [figures["what"], ""]
        setting = []
        if figures.get("shapes"):
            setting.append(f"Shapes: {_inline(figures['shapes'])}")
        for key, label in (("torch_threads", "torch threads"), ("repeats", "repeats")):
            if figures.get(key) is not None:
                setting.append(f"{label} {figures[key]}")
        if figures.get("quick"):
            setting.append("quick settings (checks the script; not the reference figures)")
        if setting:
            lines += ["; ".join(setting) + ".", ""]
        checks = figures.get("checks") or []
        if checks:
            lines += ["| figure | measured | reference | target | result | note |",
                      "|---|---:|---:|---|---|---|"]
            for check in checks:
                lines.append(f"| {_cell(check.get('name', ''))} | {_cell(format_value(check.get('value')))} | "
                             f"{_cell(_reference(check))} | {_cell(_target(check))} | "
                             f"{_VERDICT.get(check.get('passed'), '')} | {_cell(check.get('note') or '')} |")
            lines.append("")
        times = figures.get("times_s") or {}
        if times:
            parts = [f"{k} {format_value(v.get('median'))} / {format_value(v.get('min'))}" for k, v in times.items()]
            lines += [f"Times in s (median / min): {'; '.join(parts)}.", ""]
        extra = {k: v for k, v in figures.items() if k not in _SHOWN and v is not None}
        if extra:
            lines += ["Other figures: " + "; ".join(f"{k}: {_inline(v)}" for k, v in extra.items()) + ".", ""]
        verdict = {True: "PASS", False: "FAIL", None: "no target"}.get(figures.get("passed"), "no target")
        exit_code = figures.get("exit_code")
        lines += [f"Overall: **{verdict}**" + (f" (exit code {exit_code})" if exit_code not in (None, 0) else "") + ".",
                  ""]
    if command:
        lines += [f"Measured by: `{command}`", ""]
    return lines


def benchmarks_markdown(collected: dict, heading: str = "## Benchmarks") -> str:
    """A Markdown section of the merged benchmark JSON: the machine, then per bench a table of its figures
    (measured value, reference, target, PASS/FAIL, note), its times, and the command that measured it."""
    lines = [heading, ""]
    machine = collected.get("machine") or {}
    if machine:
        lines += [f"Machine: {_inline(machine)}.", ""]
    commands = collected.get("commands") or {}
    names = [name for name in collected if name not in _RESERVED and isinstance(collected[name], dict)]
    judged = [collected[n].get("passed") for n in names if "error" not in collected[n]]
    failed = [n for n in names if "error" in collected[n]]
    summary = (f"{sum(p is True for p in judged)} of {sum(p is not None for p in judged)} judged benchmarks PASS"
               + (f"; did not run: {', '.join(failed)}" if failed else ""))
    lines += [summary + ".", ""]
    for name in names:
        lines += _bench(name, collected[name], commands.get(name))
    return "\n".join(lines).rstrip() + "\n"

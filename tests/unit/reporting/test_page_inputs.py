"""write_report_page says what is wrong with a run file it cannot use, naming it, and leaves nothing behind: a name
that is not a regular file (before, a directory report.json was skipped silently) and text report.md (UTF-8) cannot
hold (before, a bare UnicodeEncodeError with report.md.tmp left behind)."""

from __future__ import annotations

import json

import pytest

from lightprune.reporting.page import write_report_page


def test_a_run_file_that_is_not_a_regular_file_is_named(tmp_path) -> None:
    (tmp_path / "plan.json").write_text(json.dumps({"keep": {"0": [0]}, "num_experts": {"0": 2}}))
    (tmp_path / "report.json").mkdir()
    with pytest.raises(IsADirectoryError, match=rf"^run file {str(tmp_path / 'report.json')!r} is a directory, not a "
                                                r"file; cannot write the report page: restore it, or move it away$"):
        write_report_page(tmp_path)
    (tmp_path / "report.json").rmdir()
    (tmp_path / "report.json").symlink_to(tmp_path / "gone.json")
    with pytest.raises(FileNotFoundError, match=r"report\.json' is a dangling symlink"):
        write_report_page(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "report.json"]


def test_text_the_page_cannot_hold_is_refused_naming_file_and_key(tmp_path) -> None:
    (tmp_path / "report.json").write_text('{"source": "tiny", "criterion": "aim\\ud800er"}')
    with pytest.raises(ValueError, match=rf"^{str(tmp_path / 'report.json')}: criterion 'aim\\ud800er' is not UTF-8 "
                                         r"text: .* which report\.md \(UTF-8\) cannot hold; .*; cannot write the report "
                                         r"page$"):
        write_report_page(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]

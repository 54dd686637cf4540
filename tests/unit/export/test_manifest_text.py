"""Text the export's UTF-8 files cannot hold (half of a UTF-16 surrogate pair) is refused before anything is written,
naming where it is: in ``save_pruned``'s card facts, and in an export's manifest that ``record_evaluation`` rewrites
with its model card (before, the card's write died on a bare UnicodeEncodeError, its staged file left behind)."""

from __future__ import annotations

import json

import pytest

from lightprune.export.card_facts import card_facts
from lightprune.export.result import EXPERT_FORMAT, MANIFEST_FILE, record_evaluation


def test_card_facts_refuse_text_that_is_not_utf8() -> None:
    with pytest.raises(ValueError, match=r"^card\['command'\] 'lightprune export \\udcff' is not UTF-8 text: it holds "
                                         r"'\\udcff', .* which the export's manifest and model card \(UTF-8\) cannot "
                                         r"hold; write the character itself, or remove it$"):
        card_facts({"command": "lightprune export \udcff"}, {0: 2})
    with pytest.raises(ValueError, match=r"^card\['evaluation'\]\['tasks'\] key 'arc\\ud800' is not UTF-8 text"):
        card_facts({"evaluation": {"tasks": {"arc\ud800": 0.5}}}, {0: 2})
    assert card_facts({"command": "lightprune export é"}, {0: 2})["command"] == "lightprune export é"


def test_record_evaluation_refuses_a_manifest_it_could_not_rewrite(tmp_path) -> None:
    manifest = tmp_path / MANIFEST_FILE
    manifest.write_text(json.dumps({"format": EXPERT_FORMAT, "plan": {"criterion": "aim\\ud800er"}})
                        .replace("\\\\ud800", "\\ud800"))  # the JSON escape itself, as a hand edit leaves it
    (tmp_path / "README.md").write_text("card")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ValueError, match=rf"^export manifest file {str(manifest)!r}: plan\['criterion'\] "
                                         r"'aim\\ud800er' is not UTF-8 text: .*; nothing was rewritten$"):
        record_evaluation(tmp_path, {"after": {"perplexity": 3.0}})
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    manifest.write_text(json.dumps({"format": EXPERT_FORMAT}))
    with pytest.raises(ValueError, match=r"^evaluation\['after'\] key 'p\\ud800' is not UTF-8 text"):
        record_evaluation(tmp_path, {"after": {"p\ud800": 3.0}})

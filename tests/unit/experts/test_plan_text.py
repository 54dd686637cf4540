"""A string that is not UTF-8 text (half of a UTF-16 surrogate pair: JSON's ``"\\ud800"`` escape, or a name's
undecodable byte ``'\\udcff'``) is refused anywhere in a plan, loaded or built, naming the file and the key path;
before, a plan holding one loaded and its export died on a bare UnicodeEncodeError writing the model card."""

from __future__ import annotations

import json
import re

import pytest

import lightprune as lp
from fixtures import PLAN_EXPERT as EXPERT
from fixtures import PLAN_MERGE as MERGE
from fixtures import PLAN_WIDTH as WIDTH
from lightprune.core.checks import check_utf8, non_utf8
from lightprune.core.errors import PlanError
from lightprune.experts.merging import MergePlan
from lightprune.width.plan import WidthPlan

LOADERS = {"plan": (lp.ExpertPlan, EXPERT), "merge plan": (MergePlan, MERGE), "width plan": (WidthPlan, WIDTH)}
SAID = "is not UTF-8 text: it holds '\\ud800', half of a UTF-16 surrogate pair without its partner"


def _write(path, data: dict, old: str, new: str) -> None:
    """``data`` as JSON with the text ``old`` replaced by ``new`` (a raw JSON escape such as ``\\ud800``)."""
    text = json.dumps(data)
    assert old in text
    path.write_text(text.replace(old, new))


@pytest.mark.parametrize("kind, old, new, where", [
    ("plan", '"aimer"', '"aim\\ud800er"', "criterion 'aim\\ud800er'"),
    ("plan", '"uniform"', '"\\ud800"', "allocation '\\ud800'"),
    ("plan", '{"normalize": null}', '{"note": {"deep": ["ok", "x\\ud800"]}}', "metadata['note']['deep'][1] 'x\\ud800'"),
    ("plan", '{"normalize": null}', '{"a\\ud800": 1}', "metadata key 'a\\ud800'"),
    ("merge plan", '"hc_smoe"', '"hc\\ud800"', "method 'hc\\ud800'"),
    ("merge plan", '"metadata": {}', '"metadata": {"x": ["\\ud800"]}', "metadata['x'][0] '\\ud800'"),
    ("width plan", '"mwop"', '"mw\\ud800"', "metadata['method'] 'mw\\ud800'"),
])
def test_a_lone_surrogate_anywhere_in_a_plan_file_is_refused_naming_file_and_key(tmp_path, kind, old, new,
                                                                                  where) -> None:
    cls, good = LOADERS[kind]
    file = tmp_path / "plan.json"
    _write(file, good, old, new)
    with pytest.raises(PlanError, match="^" + re.escape(f"{kind} file {str(file)!r}: {where} {SAID}, which a {kind} "
                                                        f"file (UTF-8 JSON) cannot hold; write the character itself, "
                                                        "or remove it")):
        cls.load(file)
    _write(file, good, old, old.replace("aimer", "aim\\u00e9r"))  # an escaped character that is whole loads
    cls.load(file)


def test_a_plan_built_in_python_is_refused_too() -> None:
    with pytest.raises(PlanError, match=r"^criterion 'aim\\ud800er' is not UTF-8 text"):
        lp.ExpertPlan(keep={0: [0]}, num_experts={0: 2}, criterion="aim\ud800er")
    with pytest.raises(PlanError, match=r"^metadata\['path'\] '/runs/\\udcff' is not UTF-8 text"):
        lp.ExpertPlan(keep={0: [0]}, num_experts={0: 2}, metadata={"path": "/runs/\udcff"})
    with pytest.raises(PlanError, match=r"^method 'x\\ud800' is not UTF-8 text"):
        MergePlan.from_dict({**MERGE, "method": "x\ud800"})
    with pytest.raises(PlanError, match=r"^metadata key 'k\\ud800' is not UTF-8 text"):
        WidthPlan(attn_keep={}, ffn_keep={}, num_heads={0: 1}, intermediate_size={}, metadata={"k\ud800": 1})


def test_non_utf8_names_the_key_path_and_the_character() -> None:
    assert non_utf8({"a": ["ok", {"b": "x\udcff"}]}) == ("a[1]['b']", "x\udcff", "\udcff")
    assert non_utf8({"a": {"k\ud800": 1}}) == ("a key", "k\ud800", "\ud800")
    assert non_utf8(["\ud83d\ude00"], "pair") == ("pair[0]", "\ud83d\ude00", "\ud83d")  # two halves are not a pair
    assert non_utf8({"a": ["é", "😀", 1.5, None]}) is None
    with pytest.raises(ValueError, match=r"^card\['command'\] 'x\\ud800' is not UTF-8 text: .* which the card "
                                         r"cannot hold"):
        check_utf8({"command": "x\ud800"}, "the card", path="card")

"""The two ways an error message caps a list (core.errors): ``listed`` writes values as a Python list, ``listed_text``
joins phrases as they are (the checkpoint checks' tensor names and shapes), both the first 8 then how many more."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightprune.core.errors import LISTED, listed, listed_text


def test_listed_writes_a_python_list_and_listed_text_a_phrase() -> None:
    names = [f"layers.{i}.w" for i in range(11)]
    assert LISTED == 8
    assert listed(names[:8]) == repr(names[:8])
    assert listed(names) == "[" + ", ".join(f"'layers.{i}.w'" for i in range(8)) + ", ... and 3 more]"
    assert listed_text(names[:8]) == ", ".join(names[:8])
    assert listed_text(names) == ", ".join(names[:8]) + ", and 3 more"
    assert listed_text(iter(names), limit=2) == "layers.0.w, layers.1.w, and 9 more"
    assert listed_text([]) == "" and listed_text(["a [2, 3] on disk"]) == "a [2, 3] on disk"
    assert listed_text(str(i) for i in range(1_008)) == ", ".join(map(str, range(8))) + ", and 1,000 more"


def test_the_checkpoint_checks_list_tensors_as_phrases() -> None:
    from lightprune.checkpoints.strict import check_loading_info

    missing = [f"model.layers.{i}.mlp.gate.weight" for i in range(10)]
    info = {"missing_keys": missing, "unexpected_keys": [], "mismatched_keys": [("a.weight", (2, 3), (3, 2))],
            "error_msgs": []}
    with pytest.raises(ValueError) as raised:
        check_loading_info(Path("ckpt"), info)
    assert str(raised.value) == (
        f"checkpoint 'ckpt' is missing 10 tensors the model needs ({', '.join(missing[:8])}, and 2 more); has 1 "
        "tensor of another shape than the model's (a.weight [2, 3] on disk, [3, 2] in the model): it would load "
        "with random weights; re-export it or restore the files (tensor names are the model's parameters, into "
        "which transformers fuses the per-expert tensors on disk)")

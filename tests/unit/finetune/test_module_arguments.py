"""MoECausalLM checks ``device_map`` and ``dtype`` when it is constructed, before the model is built, naming the
value and the choices."""

from __future__ import annotations

import pytest

from lightprune.finetune import MoECausalLM


def test_a_bad_device_map_or_dtype_is_refused_at_construction(tmp_path) -> None:
    tmp_path.joinpath("config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"^device_map 'gpu7' is not a placement transformers takes; choose one of "
                                         r"'auto'"):
        MoECausalLM(checkpoint=str(tmp_path), device_map="gpu7")
    with pytest.raises(ValueError, match=r"^dtype must be one of \['bfloat16', 'float16', 'float32', 'float64'\], "
                                         r"got 'float17' \(did you mean 'float16'\?\)$"):
        MoECausalLM(checkpoint=str(tmp_path), dtype="float17")
    MoECausalLM(checkpoint=str(tmp_path), device_map={"": "cpu"})  # nothing is built until configure_model

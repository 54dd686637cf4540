"""A tiny model's config overrides must be fields of its config (transformers keeps any other key as an attribute
nothing reads: ``num_expertz: 4`` built the default model and wrote it into config.json); a tiny family is named
with the closest one, in a short line."""

from __future__ import annotations

import pytest
import torch

from lightprune.testing.tiny import TINY_FAMILIES, check_tiny_family, check_tiny_overrides, tiny_config


def test_an_override_that_is_no_field_of_the_config_is_refused_with_the_closest() -> None:
    with pytest.raises(ValueError) as info:
        tiny_config("qwen3_moe", num_expertz=4)
    assert str(info.value) == ("tiny overrides: Qwen3MoeConfig (the qwen3_moe tiny config) has no field "
                               "'num_expertz' (did you mean 'num_experts'?); an override sets one of its fields")
    with pytest.raises(ValueError, match=r"^tiny overrides: text_config: Qwen3VLMoeTextConfig \(of the qwen3_vl_moe "
                                         r"tiny config\) has no field 'num_hiden_layers' \(did you mean "
                                         r"'num_hidden_layers'\?\)$"):
        tiny_config("qwen3_vl_moe", text_config={"num_hiden_layers": 1})
    with pytest.raises(ValueError, match="has no field 'zzz'; an override"):  # nothing close: no guess
        check_tiny_overrides("mixtral", {"zzz": 1})


def test_the_fields_a_config_has_are_taken() -> None:
    """Its own fields, the aliases transformers maps (num_experts -> num_local_experts) and a sub-config's fields."""
    assert tiny_config("qwen3_moe", num_experts=4, num_hidden_layers=1).num_local_experts == 4
    assert tiny_config("mixtral", num_experts=4).num_local_experts == 4
    assert tiny_config("qwen3_vl_moe", text_config={"num_hidden_layers": 1}).text_config.num_hidden_layers == 1
    for family in TINY_FAMILIES[:8]:  # every field of the default config can be given back as an override
        fields = {k: v for k, v in tiny_config(family).to_dict().items() if not k.startswith("_") and
                  k not in ("transformers_version", "architectures", "model_type")}
        check_tiny_overrides(family, fields)


def test_a_family_is_named_with_the_closest_in_a_short_line() -> None:
    with pytest.raises(ValueError) as info:
        check_tiny_family("qwen3moe", "tiny")
    message = str(info.value)
    assert message.startswith("tiny 'qwen3moe' is not one of the ") and "(did you mean 'qwen3_moe'?)" in message
    assert message.endswith("and the dense MLLMs llava_onevision, qwen2_5_vl (lightprune.testing.tiny.TINY_FAMILIES "
                            "lists the MoE ones)") and len(message) < 300


def test_moe_causal_lm_refuses_them_when_built_and_takes_float64() -> None:
    """At construction, before any model is built (``--model.init_args.tiny_overrides '{num_expertz: 4}'`` exported
    the default model); ``dtype: float64`` runs (its experts through transformers' eager kernel)."""
    from lightprune.finetune import MoECausalLM

    with pytest.raises(ValueError, match=r"^tiny_overrides: Qwen3MoeConfig \(the qwen3_moe tiny config\) has no "
                                         r"field 'num_expertz' \(did you mean 'num_experts'\?\)"):
        MoECausalLM(tiny="qwen3_moe", tiny_overrides={"num_expertz": 4})
    with pytest.raises(ValueError, match=r"^tiny 'qwen3moe' is not one of the \d+ tiny families \(did you mean "
                                         r"'qwen3_moe'\?\)"):
        MoECausalLM(tiny="qwen3moe")
    with pytest.raises(ValueError, match="load_in_4bit computes in float32, bfloat16 or float16"):
        MoECausalLM(tiny="qwen3_moe", dtype="float64", load_in_4bit=True)
    module = MoECausalLM(tiny="qwen3_moe", tiny_overrides={"num_hidden_layers": 1}, dtype="float64")
    module.configure_model()
    assert {p.dtype for p in module.parameters()} == {torch.float64}
    ids = torch.randint(0, 100, (2, 6))
    assert module(input_ids=ids, labels=ids).logits.dtype == torch.float64


def test_did_you_mean_takes_the_name_equal_but_for_case_first() -> None:
    """A mis-cased name is suggested as the known one (difflib alone finds 'QWEN3_MOE' close to nothing); else the
    closest, else nothing."""
    from lightprune.core.suggestions import did_you_mean

    known = ["qwen2_moe", "qwen3_moe", "qwen3_next"]
    assert did_you_mean("QWEN3_MOE", known) == " (did you mean 'qwen3_moe'?)"
    assert did_you_mean("qwen3moe", known) == " (did you mean 'qwen3_moe'?)"
    assert did_you_mean("zzz", known) == "" and did_you_mean(3, known) == ""
    check_tiny_family("qwen3_moe")
    with pytest.raises(ValueError, match=r"^tiny family 'Qwen3_MoE' is not one of the \d+ tiny families \(did you "
                                         r"mean 'qwen3_moe'\?\)"):
        check_tiny_family("Qwen3_MoE")

"""The family registry: register / refuse / unknown, the conformance table over transformers' MoE model types,
and the README's family table generated from the registry."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch
from fixtures import REPO

import lightprune as lp
from lightprune.models import FAMILIES, REFUSED, MoEFamily, family_table, register_family, unregister_family
from lightprune.models.families import DeepseekV3Family
from lightprune.models.tiny import TINY_FAMILIES, tiny_model

_EXPERTS = re.compile(r"^class \w+Experts\(nn\.Module\)", re.M)


def _declares_experts(config_class, seen=None) -> bool:
    """Whether a config class (or one of its sub-configs) declares a field counting experts: a field whose name
    holds "experts" and is not a per-token, shared or group count (vision / audio encoder configs declare none)."""
    seen = set() if seen is None else seen
    if config_class in seen:
        return False
    seen.add(config_class)
    declared = set(getattr(config_class, "__dataclass_fields__", {}))
    declared |= set(getattr(config_class, "__annotations__", {}))
    if any("experts" in f and not any(w in f for w in ("per_tok", "shared", "group", "top")) for f in declared):
        return True
    return any(isinstance(sub, type) and _declares_experts(sub, seen)
               for sub in (getattr(config_class, "sub_configs", None) or {}).values())


def generation_class_types() -> set[str]:
    """Model types transformers builds as a generative model (a causal-LM or image-text-to-text auto class): the ones
    a user loads to prune. MoE sub-models without one (a talker, a text stack built only inside its MLLM) are not
    rows of the table."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    return set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)


def transformers_moe_types() -> list[str]:
    """Every model type of the installed transformers whose modeling file defines an experts module and whose config
    declares an expert count (read from its config registry and its source files, not from a hand list: a new release
    adds rows by itself; the vision and audio encoders that share an MoE model's folder are not rows)."""
    from transformers.models.auto.configuration_auto import (
        CONFIG_MAPPING,
        CONFIG_MAPPING_NAMES,
        model_type_to_module_name,
    )

    found = []
    for model_type in CONFIG_MAPPING_NAMES:
        try:
            spec = importlib.util.find_spec(f"transformers.models.{model_type_to_module_name(model_type)}")
        except ModuleNotFoundError:
            continue
        if spec is None or not spec.submodule_search_locations:
            continue
        folder = Path(next(iter(spec.submodule_search_locations)))
        if any(_EXPERTS.search(f.read_text(errors="replace")) for f in folder.glob("modeling_*.py")) and \
                _declares_experts(CONFIG_MAPPING[model_type]):
            found.append(model_type)
    # an MLLM whose language model is an MoE type given by name (Kimi K2.5: text_config defaults to deepseek_v3)
    for model_type in CONFIG_MAPPING_NAMES:
        defaults = getattr(CONFIG_MAPPING[model_type], "sub_configs_defaults", None) or {}
        if model_type not in found and any(getattr(d, "model_type", None) in found for d in defaults.values()):
            found.append(model_type)
    return sorted(found)


def test_conformance_table_covers_every_moe_type_of_transformers(capsys) -> None:
    found = transformers_moe_types()
    generative = generation_class_types()
    types = [t for t in found if t in generative]
    sub_models = [t for t in found if t not in generative]
    assert not set(sub_models) & set(FAMILIES)  # every exact family is a model a user can load
    assert {"mixtral", "qwen3_moe", "deepseek_v3", "glm4_moe", "gpt_oss", "llama4"} <= set(types)
    exact = [t for t in types if t in FAMILIES]
    refused = [t for t in types if t in REFUSED]
    missing = [t for t in types if t not in FAMILIES and t not in REFUSED]
    # an exact family is one the parametrised conformance tests run on: it has a tiny config
    assert all(t in TINY_FAMILIES for t in exact), [t for t in exact if t not in TINY_FAMILIES]
    assert not set(exact) & set(refused)
    with capsys.disabled():
        print(f"\nfamily conformance: {len(exact)} exact, {len(refused)} refused, {len(missing)} not covered "
              f"of {len(types)} MoE model types in transformers ({len(sub_models)} MoE sub-model types without a "
              "generation class are not rows)")
        print(f"not covered: {', '.join(missing)}")
    for model_type in missing:  # neither registered nor refused: the error says so and points to the README
        assert model_type not in FAMILIES


def test_a_refused_type_says_why_and_an_unknown_one_points_to_the_readme() -> None:
    from transformers import SwitchTransformersConfig, SwitchTransformersForConditionalGeneration

    config = SwitchTransformersConfig(d_model=16, d_ff=16, num_layers=2, num_decoder_layers=2, num_heads=2,
                                      d_kv=8, num_experts=4, vocab_size=32)
    with pytest.raises(ValueError, match="cannot prune model_type 'switch_transformers' exactly yet: an "
                                         "encoder-decoder model whose experts are separate modules"):
        lp.find_moe_layers(SwitchTransformersForConditionalGeneration(config))
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=32))
    with pytest.raises(ValueError, match="unsupported model_type 'llama'.*'Add a model family' in lightprune's "
                                         "README"):
        lp.find_moe_layers(llama)


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_every_refused_type_is_refused_with_its_reason(model_type) -> None:
    from types import SimpleNamespace

    model = torch.nn.Module()
    model.config = SimpleNamespace(model_type=model_type)
    with pytest.raises(ValueError) as err:
        lp.find_moe_layers(model)
    assert str(err.value) == f"lightprune cannot prune model_type {model_type!r} exactly yet: {REFUSED[model_type]}"
    assert len(REFUSED[model_type]) > 40  # a reason, not a placeholder


def test_register_a_family_by_subclassing_one_that_routes_alike() -> None:
    model = tiny_model("glm4_moe")
    model.config.model_type = "my_glm_moe"  # a new model type, the same architecture
    with pytest.raises(ValueError, match="unsupported model_type 'my_glm_moe'"):
        lp.find_moe_layers(model)

    @register_family
    class MyGlmLikeFamily(DeepseekV3Family):
        model_types = ("my_glm_moe",)

    try:
        layers = lp.find_moe_layers(model)
        assert [l.index for l in layers] == [1, 2] and isinstance(layers[0].family, MyGlmLikeFamily)
        register_family(MyGlmLikeFamily)  # the same class again: fine
        with pytest.raises(ValueError, match="'my_glm_moe' is already registered"):
            register_family(type("Other", (DeepseekV3Family,), {"model_types": ("my_glm_moe",)}))
    finally:
        assert unregister_family("my_glm_moe") is MyGlmLikeFamily
    with pytest.raises(TypeError, match="MoEFamily subclasses"):
        register_family(object)
    with pytest.raises(ValueError, match="must name at least one config.model_type"):
        register_family(type("Empty", (MoEFamily,), {}))


def test_the_readme_family_table_is_the_registry_s() -> None:
    readme = (REPO / "README.md").read_text()
    start = readme.index("<!-- family table: generated by lightprune.models.family_table() -->\n")
    end = readme.index("<!-- end of family table -->")
    assert readme[start:end].split("\n", 1)[1] == family_table()


@pytest.mark.parametrize("family,language_model", [("internvl", "qwen3_moe"), ("kimi_k25", "deepseek_v3")])
def test_an_mllm_family_refuses_another_language_model(family, language_model) -> None:
    from lightprune.models.tiny import tiny_model

    model = tiny_model(family)
    lp.get_family(model)  # its own language model is accepted
    model.config.text_config.model_type = "mixtral"
    with pytest.raises(ValueError, match=f"supported with a {language_model} language model, got 'mixtral'"):
        lp.get_family(model)

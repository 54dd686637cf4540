"""The family registry: register / refuse / unknown, the conformance table over transformers' MoE model types,
and the documented family table (docs/extending/family.md) generated from the registry."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
import torch
from fixtures import REPO

import lightprune as lp
from lightprune.models import FAMILIES, REFUSED, MoEFamily, family_table, register_family, unregister_family
from lightprune.models.families import DeepseekV3Family
from lightprune.testing.tiny import TINY_FAMILIES, tiny_model

#: one model type's verdict when it is not a row of the conformance table (a row's verdict is None)
NO_GENERATION_CLASS = "no generation class (encoder, audio, vision, retrieval, a sub-config, ...)"
DENSE = "dense: its modeling code routes no tokens to experts"
MOE_SEQ2SEQ = "an MoE sequence-to-sequence model (encoder-decoder, speech-to-text) without a generation class"
MOE_SUB_MODEL = "an MoE sub-model without a generation class (a text stack built inside its MLLM, a talker, ...)"
NO_MODELING_FILE = "its generation class is defined in no modeling file of transformers"
DENSE_BY_CONFIG = "dense: its config refuses the MoE block its modeling code can build (a draft model)"
NOT_A_ROW = (NO_GENERATION_CLASS, DENSE, MOE_SEQ2SEQ, MOE_SUB_MODEL, NO_MODELING_FILE, DENSE_BY_CONFIG)
#: model types whose config's validation refuses the MoE block (shown in test_refusal_demonstrations.py: Gemma 4's
#: assistant, a speculative-decoding draft model, refuses ``enable_moe_block=True``)
_CONFIG_REFUSES_MOE = frozenset({"gemma4_assistant"})

#: what the former discovery found on transformers 5.25 (a folder of the model type whose modeling file defines
#: ``class XxxExperts(nn.Module)``, a config declaring an expert count, and the MLLMs whose sub-config defaults to one
#: of those): each is still a row or has a verdict saying why it is an MoE type that is not one
_FOUND_BY_THE_FOLDER_SCAN = frozenset({
    "afmoe", "aria", "aria_text", "axk1", "axk2", "bailing_hybrid", "beam", "cohere2_moe", "dbrx", "deepseek_ocr2",
    "deepseek_ocr2_text", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v4", "diffusion_gemma",
    "diffusion_gemma_text", "dots1", "dots3_note", "dots3_note_text", "dots3_note_vision_encoder", "ernie4_5_moe",
    "ernie4_5_vl_moe", "ernie4_5_vl_moe_text", "exaone_moe", "flex_olmo", "flint", "gemma4", "gemma4_assistant",
    "gemma4_text", "glm4_moe", "glm4_moe_lite", "glm4v_moe", "glm4v_moe_text", "glm5_next", "glm5_next_text",
    "glm_moe_dsa", "gpt_oss", "granitemoe", "granitemoe_swa", "granitemoehybrid", "granitemoeshared",
    "hunyuan_v1_moe", "hy_v3", "hy_v4", "hy_v4_vl", "hy_v4_vl_text", "inkling2", "inkling2_loop",
    "inkling2_loop_text", "inkling2_text", "inkling_mm_model", "inkling_text", "jamba", "jetmoe", "kimi_k25",
    "kimi_linear", "kolibri1", "kolibri1_1", "laguna", "lara_mini", "lfm2_moe", "llama4", "llama4_text",
    "longcat_flash", "mellum", "mimo_v2_flash", "minicpm5_moe", "minimax", "minimax_m2", "minimax_m3_vl",
    "minimax_m3_vl_text", "mistral4", "mistral_large4", "mistral_large4_text", "mixtral", "muse_spark",
    "muse_spark_text", "nemo_speechlm", "nemotron_h", "nemotron_h_omni", "olmoe", "openai_privacy_filter", "phimoe",
    "qwen2_moe", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_moe", "qwen3_next", "qwen3_omni_moe",
    "qwen3_omni_moe_talker_text", "qwen3_omni_moe_text", "qwen3_omni_moe_thinker", "qwen3_vl_moe",
    "qwen3_vl_moe_text", "qwen4_exp", "qwen4_exp_text", "solar_open", "step3p5", "step3p7", "unlimited_ocr",
    "unlimited_ocr_text", "zaya"
})

_CLASS = re.compile(r"^class (\w+)\(", re.MULTILINE)
_DOCSTRING = re.compile(r"(\"\"\"|''')[\s\S]*?\1")
_COMMENT = re.compile(r"#[^\n]*")
_TOP_LEVEL = re.compile(r"^(?=class |def )", re.MULTILINE)
_SELECTS = re.compile(r"\b(?:topk|top_k|argmax)\b")
_NAMES_AN_EXPERT = re.compile("experts", re.IGNORECASE)
_BUILDS_A_SUB_MODEL = re.compile(r"\bAutoModel\w*\.from_config\(")
_NAMES_A_MODEL_TYPE = re.compile(r"\bmodel_type\s*=\s*[\"'](\w+)[\"']")


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


def _models_folder() -> Path:
    import transformers

    return Path(transformers.__file__).parent / "models"


@cache
def _file_defining(kind: str = "modeling") -> dict[str, Path]:
    """Class name -> the ``kind`` file (modeling or configuration) of the installed transformers that defines it: one
    text scan of ``transformers/models/*/{kind}_*.py`` (no model imported). A class may live in another model's folder:
    sarvam_moe is built by ``Glm4MoeForCausalLM`` of glm4_moe."""
    files: dict[str, Path] = {}
    for path in sorted(_models_folder().glob(f"*/{kind}_*.py")):
        for name in _CLASS.findall(path.read_text(errors="replace")):
            files.setdefault(name, path)
    return files


@cache
def _source(path: Path) -> str:
    return path.read_text(errors="replace")


@cache
def _builds_a_sub_model(path: Path) -> bool:
    return bool(_BUILDS_A_SUB_MODEL.search(_source(path)))


@cache
def _routes_tokens_to_experts(path: Path) -> bool:
    """Whether a modeling file routes tokens to experts, whatever it names things: one of its top-level classes or
    functions (code only: comments and docstrings left out) both selects (``topk`` / ``top_k`` / ``argmax``) and names
    the experts (an identifier holding "experts": ``num_experts``, ``n_routed_experts``, ``self.experts``, ...; one
    holding "expert" alone is no MoE: PI0's action expert)."""
    code = _COMMENT.sub("", _DOCSTRING.sub("", _source(path)))
    return any(_SELECTS.search(block) and _NAMES_AN_EXPERT.search(block) for block in _TOP_LEVEL.split(code))


def _class_names(mapping, model_type: str) -> tuple[str, ...]:
    names = mapping.get(model_type, ())
    return (names,) if isinstance(names, str) else tuple(names)


@cache
def moe_verdicts() -> dict[str, str | None]:
    """Every model type of the installed transformers' ``CONFIG_MAPPING_NAMES`` -> its verdict: None for a row of the
    conformance table (an MoE model type a user loads to generate), else why it is not one (one of :data:`NOT_A_ROW`).

    A row: its generation class (the causal-LM or image-text-to-text auto class, resolved from transformers' auto
    mappings, wherever its folder) is defined in a modeling file that routes tokens to experts; or that class builds its
    language model from a sub-config (``AutoModel*.from_config``) whose default model type's code routes tokens to
    experts (Kimi K2.5: text_config defaults to deepseek_v3). Read from the registry and the source files, not from a
    hand list: a new release adds rows by itself. Not a row: no such class (an MoE one then says so when its code routes
    tokens to experts and its config counts them, or its language-model sub-config defaults to an MoE type), or a
    generation class whose code routes no tokens to experts (dense)."""
    from transformers.models.auto import modeling_auto as auto
    from transformers.models.auto.configuration_auto import (
        CONFIG_MAPPING,
        CONFIG_MAPPING_NAMES,
        model_type_to_module_name,
    )

    generation = (auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
    seq2seq = (auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES)
    any_class = (*generation, auto.MODEL_MAPPING_NAMES, *seq2seq)
    files, config_files = _file_defining(), _file_defining("configuration")

    def routes(model_type: str, mappings) -> bool:
        return any(name in files and _routes_tokens_to_experts(files[name])
                   for mapping in mappings for name in _class_names(mapping, model_type))

    def builds_an_moe_sub_model(model_type: str, paths) -> bool:  # a language-model sub-config defaulting to MoE
        config_file = config_files.get(CONFIG_MAPPING_NAMES[model_type])  # the config is imported only if its source
        named = _NAMES_A_MODEL_TYPE.findall(_source(config_file)) if config_file else ()
        if not any(t in CONFIG_MAPPING_NAMES and routes(t, any_class) for t in named):  # names an MoE model type
            return False
        if not any(map(_builds_a_sub_model, paths)):
            return False
        defaults = getattr(CONFIG_MAPPING[model_type], "sub_configs_defaults", None) or {}
        sub_types = {getattr(d, "model_type", None) for key, d in defaults.items()
                     if any(w in key for w in ("text", "language", "llm"))} & set(CONFIG_MAPPING_NAMES)
        return any(routes(t, any_class) for t in sub_types)

    verdicts: dict[str, str | None] = {}
    for model_type in CONFIG_MAPPING_NAMES:
        names = [name for mapping in generation for name in _class_names(mapping, model_type)]
        if not names:  # MoE when its code routes tokens to experts and its config counts them (not a vision tower)
            paths = {files[name] for mapping in seq2seq for name in _class_names(mapping, model_type) if name in files}
            paths |= set((_models_folder() / model_type_to_module_name(model_type)).glob("modeling_*.py"))
            moe = (routes(model_type, any_class) or any(map(_routes_tokens_to_experts, paths))) \
                and _declares_experts(CONFIG_MAPPING[model_type]) or builds_an_moe_sub_model(model_type, paths)
            verdicts[model_type] = NO_GENERATION_CLASS if not moe else MOE_SEQ2SEQ \
                if any(model_type in mapping for mapping in seq2seq) else MOE_SUB_MODEL
        elif not all(name in files for name in names):
            verdicts[model_type] = NO_MODELING_FILE
        elif model_type in _CONFIG_REFUSES_MOE:
            verdicts[model_type] = DENSE_BY_CONFIG
        elif routes(model_type, generation):
            verdicts[model_type] = None
        else:
            verdicts[model_type] = None if builds_an_moe_sub_model(model_type, {files[n] for n in names}) else DENSE
    return verdicts


def test_conformance_table_covers_every_moe_type_of_transformers(capsys) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    verdicts = moe_verdicts()
    assert set(verdicts) == set(CONFIG_MAPPING_NAMES)  # no model type without a verdict
    types = sorted(t for t, why in verdicts.items() if why is None)
    not_rows = {t: why for t, why in verdicts.items() if why is not None}
    assert set(not_rows.values()) <= set(NOT_A_ROW)
    assert not [t for t, why in not_rows.items() if why == NO_MODELING_FILE]  # every generation class was found
    # the known MoE types, and one whose generation class lives in another model's folder
    assert {"mixtral", "qwen3_moe", "deepseek_v3", "glm4_moe", "gpt_oss", "llama4", "sarvam_moe"} <= set(types)
    assert verdicts["llama"] == DENSE and verdicts["switch_transformers"] == MOE_SEQ2SEQ
    # what the former folder scan found is still a row, or an MoE type that says why it is not one (its rows all have a
    # generation class, so they are all rows still)
    assert {t: not_rows[t] for t in _FOUND_BY_THE_FOLDER_SCAN & set(not_rows)
            if not_rows[t] not in (MOE_SUB_MODEL, MOE_SEQ2SEQ, DENSE_BY_CONFIG)} == {}
    # every exact family is a model a user can load (InternVL's default language model is dense: its family is exact
    # for one with a Qwen3-MoE language model)
    assert not {t: not_rows[t] for t in FAMILIES if t in not_rows and not_rows[t] != DENSE}
    exact = [t for t in types if t in FAMILIES]
    refused = [t for t in types if t in REFUSED]
    missing = [t for t in types if t not in FAMILIES and t not in REFUSED]
    # an exact family is one the parametrised conformance tests run on: it has a tiny config
    assert all(t in TINY_FAMILIES for t in exact), [t for t in exact if t not in TINY_FAMILIES]
    assert not set(exact) & set(refused)
    with capsys.disabled():
        print(f"\nfamily conformance: {len(types)} rows (MoE model types in transformers): {len(exact)} exact, "
              f"{len(refused)} refused, {len(missing)} not covered; {len(not_rows)} model types are not rows")
        for reason in NOT_A_ROW:
            listed = sorted(t for t, why in not_rows.items() if why == reason)
            if listed:
                print(f"not a row, {reason}: {len(listed)}: {', '.join(listed)}")
        for model_type in refused:
            print(f"refused {model_type}: {REFUSED[model_type]}")
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
    with pytest.raises(ValueError, match="unsupported model_type 'llama'.*docs/extending/family.md"):
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


def test_the_documented_family_table_is_the_registry_s() -> None:
    readme = (REPO / "docs" / "extending" / "family.md").read_text()
    start = readme.index("<!-- family table: generated by lightprune.models.family_table() -->\n")
    end = readme.index("<!-- end of family table -->")
    assert readme[start:end].split("\n", 1)[1] == family_table()


@pytest.mark.parametrize("family,language_model", [("internvl", "qwen3_moe"), ("kimi_k25", "deepseek_v3")])
def test_an_mllm_family_refuses_another_language_model(family, language_model) -> None:
    from lightprune.testing.tiny import tiny_model

    model = tiny_model(family)
    lp.get_family(model)  # its own language model is accepted
    model.config.text_config.model_type = "mixtral"
    with pytest.raises(ValueError, match=f"supported with a {language_model} language model, got 'mixtral'"):
        lp.get_family(model)

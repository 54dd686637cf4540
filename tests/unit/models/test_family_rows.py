"""Families declared as table rows (family_row) are the classes they were as class bodies, and the family registry
built on lightprune.core.registry.Registry keeps its mapping, its errors and its all-or-none registration."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from lightprune.models import FAMILIES, REFUSED, MoEFamily, refuse_family, register_family, unregister_family
from lightprune.models.family_rows import family_row, row_name

_IMAGES = ("image_token_id", "video_token_id")
_DS, _SM, _FA = "deepseek_families", "softmax_routing", "families"

#: model type -> (class name, module, parent class, settings) of every family that is a row, as the class bodies
#: and alike_family calls declared them before
ROWS = {
    "glm4_moe": ("Glm4MoeFamily", _DS, "DeepseekV3Family", {}),
    "glm4v_moe": ("Glm4vMoeFamily", _DS, "DeepseekV3Family", {"multimodal": True, "vision_token_keys": _IMAGES}),
    "kimi_k25": ("KimiK25Family", _DS, "DeepseekV3Family", {"multimodal": True, "vision_token_keys": _IMAGES,
                                                            "language_model_type": "deepseek_v3"}),
    "dots1": ("Dots1Family", _DS, "DeepseekV3Family", {}),
    "dots3_note_text": ("Dots3NoteTextFamily", _DS, "DeepseekV3Family", {}),
    "exaone_moe": ("ExaoneMoeFamily", _DS, "DeepseekV3Family", {"num_experts_key": "num_experts"}),
    "solar_open": ("SolarOpenFamily", _DS, "DeepseekV3Family", {}),
    "mimo_v2_flash": ("MimoV2FlashFamily", _DS, "DeepseekV3Family", {}),
    "hy_v4": ("HyV4Family", _DS, "DeepseekV3Family", {}),
    "deepseek_v32": ("DeepseekV32Family", _DS, "DeepseekV3Family", {}),
    "glm_moe_dsa": ("GlmMoeDsaFamily", _DS, "DeepseekV3Family", {}),
    "glm4_moe_lite": ("Glm4MoeLiteFamily", _DS, "DeepseekV3Family", {}),
    "axk1": ("Axk1Family", _DS, "DeepseekV3Family", {}),
    "kimi_linear": ("KimiLinearFamily", _DS, "DeepseekV3Family", {"num_experts_key": "num_local_experts"}),
    "bailing_hybrid": ("BailingHybridFamily", _DS, "DeepseekV3Family", {"num_experts_key": "num_local_experts"}),
    "qwen2_moe": ("Qwen2MoeFamily", _SM, "_SoftmaxFamily", {"shared_attrs": ("shared_expert",)}),
    "qwen3_moe": ("Qwen3MoeFamily", _SM, "_SoftmaxFamily", {}),
    "qwen3_vl_moe": ("Qwen3VLMoeFamily", _SM, "_SoftmaxFamily", {
        "routing": "softmax, top-k, renormalised", "multimodal": True, "renormalize_always": True,
        "vision_token_keys": _IMAGES}),
    "qwen3_omni_moe_thinker": ("Qwen3OmniMoeThinkerFamily", _SM, "_SoftmaxFamily",
                               {"multimodal": True, "vision_token_keys": _IMAGES}),
    "internvl": ("InternVLFamily", _SM, "_SoftmaxFamily", {"multimodal": True, "language_model_type": "qwen3_moe",
                                                           "vision_token_keys": ("image_token_id",)}),
    "minimax": ("MiniMaxFamily", _SM, "MixtralFamily", {}),
    "flex_olmo": ("FlexOlmoFamily", _SM, "OlmoeFamily", {}),
    "qwen3_5_moe_text": ("Qwen3_5MoeTextFamily", _SM, "Qwen2MoeFamily",
                         {"routing": "softmax, top-k, renormalised", "renormalize_always": True}),
    "qwen3_5_moe": ("Qwen3_5MoeFamily", _SM, "Qwen3_5MoeTextFamily",
                    {"multimodal": True, "vision_token_keys": _IMAGES}),
    "mellum": ("MellumFamily", _SM, "OlmoeFamily", {}),
    "qwen3_next": ("Qwen3NextFamily", _SM, "Qwen2MoeFamily", {}),
    "qwen4_exp_text": ("Qwen4ExpTextFamily", _SM, "Qwen2MoeFamily", {}),
    "qwen4_exp": ("Qwen4ExpFamily", _SM, "Qwen4ExpTextFamily", {"multimodal": True, "vision_token_keys": _IMAGES}),
    "gemma4": ("Gemma4Family", _FA, "Gemma4TextFamily", {"multimodal": True, "vision_token_keys": _IMAGES}),
}


@pytest.mark.parametrize("model_type", sorted(ROWS))
def test_a_row_is_the_class_it_was(model_type) -> None:
    import importlib

    name, module, parent, settings = ROWS[model_type]
    cls = FAMILIES[model_type]
    assert (cls.__name__, cls.__qualname__, cls.__module__) == (name, name, f"lightprune.models.{module}")
    assert [base.__name__ for base in cls.__bases__] == [parent] and cls.model_types == (model_type,)
    assert "model_types" in vars(cls) and set(vars(cls)) - {"model_types", "__module__", "__doc__"} >= set(settings)
    for key, value in settings.items():
        assert getattr(cls, key) == value, key
    parent_cls = cls.__bases__[0]
    for key in ("num_experts_key", "multimodal", "vision_token_keys", "language_model_type", "shared_attrs",
                "routing", "mlp_attr", "router_attr", "experts_attr"):
        if key not in settings:
            assert getattr(cls, key) == getattr(parent_cls, key), key  # everything else inherited
    assert cls.__doc__ and model_type in cls.__doc__
    where = importlib.import_module(f"lightprune.models.{module}")
    assert getattr(where, name, cls) is cls  # a named row is importable where it is defined


def test_a_row_accepts_settings_only() -> None:
    from lightprune.models.deepseek_families import DeepseekV3Family

    row = family_row(__name__, DeepseekV3Family, "my_v3_like", "``my_v3_like``: DeepSeek-V3's router.",
                     num_experts_key="num_local_experts")
    assert row.__name__ == row_name("my_v3_like") == "MyV3LikeFamily" and issubclass(row, DeepseekV3Family)
    assert row.model_types == ("my_v3_like",) and row.num_experts_key == "num_local_experts"
    assert "my_v3_like" not in FAMILIES  # a row is not registered by itself
    with pytest.raises(TypeError, match="'num_expert_key' not a setting of DeepseekV3Family"):
        family_row(__name__, DeepseekV3Family, "x_moe", "doc", num_expert_key="n")  # a typo is not a new attribute
    with pytest.raises(TypeError, match="'select' not a setting"):
        family_row(__name__, DeepseekV3Family, "x_moe", "doc", select=lambda *a: None)
    with pytest.raises(TypeError, match="'model_types' not a setting"):
        family_row(__name__, DeepseekV3Family, "x_moe", "doc", model_types=("y",))
    with pytest.raises(ValueError, match="name must be an identifier ending in 'Family', got 'X-Moe'"):
        family_row(__name__, DeepseekV3Family, "x_moe", "doc", name="X-Moe")
    with pytest.raises(ValueError, match="say in doc"):
        family_row(__name__, DeepseekV3Family, "x_moe", " ")
    with pytest.raises(TypeError, match="base must be a MoEFamily subclass"):
        family_row(__name__, object, "x_moe", "doc")


def test_families_is_a_read_only_view_of_the_registry() -> None:
    assert isinstance(FAMILIES, Mapping) and not isinstance(FAMILIES, dict)
    assert list(FAMILIES) == sorted(FAMILIES) and len(FAMILIES) == len(dict(FAMILIES))
    assert FAMILIES.get("no_such_type") is None and None not in FAMILIES
    with pytest.raises(TypeError):
        FAMILIES["x"] = MoEFamily  # type: ignore[index]
    cls = type("ViewFamily", (MoEFamily,), {"model_types": ("view_moe",)})
    register_family(cls)
    try:
        assert FAMILIES["view_moe"] is cls and "view_moe" in FAMILIES
    finally:
        unregister_family("view_moe")
    assert "view_moe" not in FAMILIES
    with pytest.raises(KeyError, match="no family for model_type 'view_moe'; registered: \\["):
        unregister_family("view_moe")


def test_registration_is_all_or_none_and_lifts_a_refusal() -> None:
    mixtral = FAMILIES["mixtral"]
    clash = type("ClashFamily", (MoEFamily,), {"model_types": ("fresh_moe", "mixtral")})
    with pytest.raises(ValueError, match="model_type 'mixtral' is already registered to lightprune.models."
                                         "softmax_routing.MixtralFamily; unregister_family\\('mixtral'\\) first"):
        register_family(clash)
    assert "fresh_moe" not in FAMILIES and FAMILIES["mixtral"] is mixtral
    refuse_family("fresh_moe", "refused for this test")
    try:
        register_family(type("FreshFamily", (MoEFamily,), {"model_types": ("fresh_moe",)}))
        assert "fresh_moe" not in REFUSED and "fresh_moe" in FAMILIES
    finally:
        REFUSED.pop("fresh_moe", None)
        if "fresh_moe" in FAMILIES:
            unregister_family("fresh_moe")

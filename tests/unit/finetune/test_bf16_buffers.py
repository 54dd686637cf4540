"""Half precision keeps the buffers transformers keeps in fp32: after Lightning's ``bf16-true`` conversion (its
precision plugin's ``convert_module``, directly and through a Trainer run), after ``dtype: bfloat16``, and in the
export of a model cast by hand, the model holds the buffers and computes the logits ``from_pretrained(dtype=bf16)``
gives, and its bf16 export verifies."""

from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch
from lightning.pytorch.plugins import HalfPrecision

import lightprune as lp
from lightprune.checkpoints.classes import auto_class
from lightprune.cli.trainer import PruneTrainer
from lightprune.export import MANIFEST_FILE
from lightprune.export.verify import ExportVerificationError, default_probe, model_logits, restore_fp32_buffers
from lightprune.finetune import MoECausalLM
from lightprune.testing.tiny import tiny_model

#: 128 positions (the tiny models' maximum): rotary frequencies rounded to bf16 move the logits by ~30% of their size
LONG = (2, 128)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def from_pretrained_bf16(model: torch.nn.Module, path) -> torch.nn.Module:
    """``model`` (fp32) saved and loaded back the way transformers loads a checkpoint in bf16."""
    model.save_pretrained(path)
    return auto_class(model.config).from_pretrained(path, dtype=torch.bfloat16).eval()


def assert_same_tensors(got: torch.nn.Module, want: torch.nn.Module) -> None:
    """Every buffer and parameter of ``got`` has ``want``'s dtype and values."""
    for kind in ("named_buffers", "named_parameters"):
        a, b = dict(getattr(got, kind)()), dict(getattr(want, kind)())
        assert a.keys() == b.keys(), kind
        for name in b:
            assert a[name].dtype == b[name].dtype, name
            assert torch.equal(a[name], b[name]), name


def rotary(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: buf for name, buf in model.named_buffers() if name.endswith("inv_freq")}


@pytest.mark.parametrize("family", ["qwen3_moe", "gemma4_text", "qwen3_vl_moe"])
def test_bf16_true_conversion_leaves_the_model_as_from_pretrained_does(tmp_path, family):
    """gemma4_text: several rotary tables and an ``embed_scale`` that does follow the dtype; qwen3_vl_moe: a vision
    tower with its own rotary embedding."""
    module = MoECausalLM(tiny=family)
    module.configure_model()
    loaded = from_pretrained_bf16(module.model, tmp_path / "fp32")
    plain = copy.deepcopy(module.model).to(torch.bfloat16)  # torch's own cast, for contrast
    assert HalfPrecision("bf16-true").convert_module(module) is module  # what the strategy's setup runs

    assert rotary(loaded) and all(buf.dtype == torch.float32 for buf in rotary(loaded).values())
    assert all(buf.dtype == torch.bfloat16 for buf in rotary(plain).values())
    assert_same_tensors(module.model, loaded)
    probe = default_probe(loaded, shape=LONG)
    assert torch.equal(model_logits(module.model, probe), model_logits(loaded, probe))
    assert not torch.equal(model_logits(plain, probe), model_logits(loaded, probe))
    if family == "gemma4_text":
        assert module.model.model.embed_tokens.embed_scale.dtype == torch.bfloat16


def test_dtype_bfloat16_builds_the_tiny_model_as_from_pretrained_does(tmp_path):
    module = MoECausalLM(tiny="qwen3_moe", dtype="bfloat16")
    module.configure_model()
    loaded = from_pretrained_bf16(tiny_model("qwen3_moe", seed=0), tmp_path / "fp32")
    assert_same_tensors(module.model, loaded)


def test_a_bf16_true_trainer_run_keeps_the_rotary_buffers_in_fp32(tmp_path):
    module = MoECausalLM(tiny="qwen3_moe")
    module.configure_model()
    loaded = from_pretrained_bf16(module.model, tmp_path / "fp32")
    ids = torch.randint(3, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    trainer = PruneTrainer(accelerator="cpu", devices=1, precision="bf16-true", logger=False,
                           enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                           default_root_dir=str(tmp_path), limit_val_batches=1)
    trainer.validate(module, dataloaders=torch.utils.data.DataLoader([batch], batch_size=None), verbose=False)
    assert module.model.model.embed_tokens.weight.dtype == torch.bfloat16  # the plugin did convert the module
    assert_same_tensors(module.model, loaded)


def test_a_bf16_true_model_exports_and_verifies(tmp_path, monkeypatch):
    module = MoECausalLM(tiny="qwen3_moe")
    module.configure_model()
    HalfPrecision("bf16-true").convert_module(module)
    model = module.model.eval()
    plain = copy.deepcopy(tiny_model("qwen3_moe", seed=0)).to(torch.bfloat16)
    plan = lp.select_experts(lp.score_weights(model, "aimer"), ratio=0.5)
    probe = default_probe(model, shape=LONG)

    result = lp.export_pruned(model, plan, tmp_path / "ckpt", probe=probe)
    manifest = json.loads((result.path / MANIFEST_FILE).read_text())
    assert manifest["dtype"] == "bfloat16" and manifest["verification"]["max_abs_diff"] == 0.0
    assert torch.equal(model_logits(lp.load_pruned(result.path), probe), model_logits(model, probe))

    # without the buffers restored, the same export of a plain bf16 cast is refused
    from lightprune.export import verification

    monkeypatch.setattr(verification, "restore_fp32_buffers", lambda model: [])
    with pytest.raises(ExportVerificationError):
        lp.export_pruned(plain, plan, tmp_path / "plain", probe=probe)


def test_the_export_of_a_model_cast_by_hand_recomputes_its_rotary_buffers_in_fp32(tmp_path):
    source = tiny_model("qwen3_moe", seed=0)
    loaded = from_pretrained_bf16(source, tmp_path / "fp32")
    model = copy.deepcopy(source).to(torch.bfloat16)
    assert {buf.dtype for buf in rotary(model).values()} == {torch.bfloat16}
    probe = default_probe(model, shape=LONG)
    layers = lp.find_moe_layers(model)
    plan = lp.ExpertPlan(keep={layer.index: list(range(layer.num_experts)) for layer in layers},
                         num_experts={layer.index: layer.num_experts for layer in layers})  # every expert kept

    result = lp.export_pruned(model, plan, tmp_path / "ckpt", probe=probe)
    assert result.max_abs_diff == 0.0
    assert_same_tensors(model, loaded)
    assert torch.equal(model_logits(model, probe), model_logits(loaded, probe))
    assert restore_fp32_buffers(model) == []  # nothing left to restore
    again = copy.deepcopy(source).to(torch.bfloat16)
    assert sorted(restore_fp32_buffers(again)) == ["model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"]

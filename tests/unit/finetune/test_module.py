"""MoECausalLM fine-tuning: adapters from YAML, optimizers and schedules, QLoRA on CPU, validation metrics."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from fixtures import REPO

from lightprune.cli.app import cli_main
from lightprune.cli.trainer import PruneTrainer
from lightprune.data import SyntheticTokens
from lightprune.finetune import AdapterSpec, MoECausalLM, merged_router_weights, router_is_trainable
from lightprune.finetune.optim import build_optimizer, lr_factor
from lightprune.models import find_moe_layers

REPO = REPO


def _trainer(tmp_path, **kw):
    args = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, default_root_dir=str(tmp_path), max_steps=3, limit_val_batches=0,
                num_sanity_val_steps=0)
    return PruneTrainer(**{**args, **kw})


def _router_base(model) -> dict[int, torch.Tensor]:
    out = {}
    for layer in find_moe_layers(model):
        router = layer.router
        while hasattr(router, "base_layer"):
            router = router.base_layer
        out[layer.index] = router.weight.detach().clone()
    return out


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_arguments_are_validated_with_allowed_values():
    with pytest.raises(ValueError, match=r"optimizer must be one of \['adamw', 'adamw8bit'\], got 'sgd'"):
        MoECausalLM(tiny="qwen3_moe", optimizer="sgd")
    with pytest.raises(ValueError, match=r"scheduler must be one of \['cosine', 'constant'\], got 'linear'"):
        MoECausalLM(tiny="qwen3_moe", scheduler="linear")
    with pytest.raises(ValueError, match="kind must be one of"):
        MoECausalLM(tiny="qwen3_moe", adapter={"kind": "prefix"})


def test_fit_with_router_lora_moves_router_rows_only_through_the_adapter(tmp_path):
    module = MoECausalLM(tiny="qwen3_moe", adapter=AdapterSpec(r=4, alpha=4, dropout=0.0), learning_rate=1e-2,
                         weight_decay=0.01, warmup_steps=1)
    module.configure_model()
    before = _router_base(module.base_model)
    _trainer(tmp_path).fit(module, datamodule=SyntheticTokens(num_samples=6, seq_len=12))
    assert router_is_trainable(module.model)
    assert module.base_model is module.model.get_base_model()
    after = _router_base(module.base_model)
    for index, merged in merged_router_weights(module.model).items():
        assert torch.equal(after[index], before[index])
        assert (merged - before[index]).norm(dim=1).gt(0).all()


def test_adapter_is_filled_from_yaml_by_the_cli(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    config = tmp_path / "lora.yaml"
    config.write_text("model:\n  class_path: lightprune.finetune.MoECausalLM\n  init_args:\n    tiny: olmoe\n"
                      "    adapter: {kind: lora, targets: [router, attention], r: 4, alpha: 8, dropout: 0.1}\n"
                      "    optimizer: adamw8bit\n    learning_rate: 2.0e-4\n    weight_decay: 0.01\n"
                      "    warmup_steps: 1\n    scheduler: cosine\n")
    cli = cli_main(["fit", "--config", str(config), "--data", "lightprune.data.SyntheticTokens",
                    "--trainer.accelerator", "cpu", "--trainer.logger", "false", "--trainer.enable_checkpointing",
                    "false", "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path),
                    "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0"])
    module = cli.model
    assert module.adapter == AdapterSpec(kind="lora", targets=["router", "attention"], r=4, alpha=8, dropout=0.1)
    assert cli.trainer.global_step == 2
    names = [n for n, p in module.model.named_parameters() if p.requires_grad]
    assert any(".mlp.gate.lora_A" in n for n in names) and any(".self_attn.q_proj.lora_A" in n for n in names)
    import bitsandbytes as bnb

    assert isinstance(cli.trainer.optimizers[0], bnb.optim.AdamW8bit)


def test_warmup_cosine_schedule_per_step(tmp_path):
    assert [lr_factor(s, "cosine", 2, 10) for s in (0, 1)] == [1 / 3, 2 / 3]
    assert lr_factor(2, "cosine", 2, 10) == 1.0 and lr_factor(6, "cosine", 2, 10) == pytest.approx(0.5)
    assert lr_factor(10, "cosine", 2, 10) == pytest.approx(0.0)
    assert lr_factor(7, "constant", 2, 10) == 1.0
    module = MoECausalLM(tiny="olmoe", adapter=AdapterSpec(dropout=0.0), learning_rate=1e-3, warmup_steps=2)
    trainer = _trainer(tmp_path, max_steps=6)
    trainer.fit(module, datamodule=SyntheticTokens(num_samples=12, seq_len=8))
    lr = trainer.optimizers[0].param_groups[0]["lr"]
    assert lr == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 4 / 4)), abs=1e-12)


def test_adamw8bit_steps_on_cpu_with_8bit_state():
    param = torch.nn.Parameter(torch.randn(64, 128))  # >= bitsandbytes' min_8bit_size: 8-bit moments
    opt = build_optimizer([param], "adamw8bit", lr=1e-2, weight_decay=0.01)
    before = param.detach().clone()
    param.grad = torch.randn_like(param)
    opt.step()
    assert not torch.equal(param.detach(), before)
    assert opt.state[param]["state1"].dtype == torch.uint8


def test_qlora_4bit_base_on_cpu(tmp_path):
    import bitsandbytes as bnb

    module = MoECausalLM(tiny="qwen3_moe", load_in_4bit=True, optimizer="adamw8bit", learning_rate=1e-2,
                         adapter=AdapterSpec(targets=["router", "attention"], r=4, alpha=4, dropout=0.0))
    module.configure_model()
    base = module.base_model
    quantized = [m for m in base.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(quantized) == 3 * 4  # q, k, v, o of each layer; the head stays full precision
    assert all(m.weight.dtype == torch.uint8 for m in quantized)
    before = _router_base(base)
    trainer = _trainer(tmp_path, max_steps=2)
    trainer.fit(module, datamodule=SyntheticTokens(num_samples=4, seq_len=8))
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    for index, merged in merged_router_weights(module.model).items():
        assert not torch.equal(merged, before[index])


def test_validation_metrics_equal_an_independent_computation(tmp_path):
    module = MoECausalLM(tiny="qwen3_moe")
    module.configure_model()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 100, (3, 10), generator=g)
    labels = ids.clone()
    labels[:, :4] = -100  # prompt tokens
    labels[2, 8:] = -100
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    trainer = _trainer(tmp_path, limit_val_batches=1)
    metrics = trainer.validate(module, dataloaders=torch.utils.data.DataLoader([batch], batch_size=None),
                               verbose=False)[0]

    with torch.no_grad():
        logits = module.model(input_ids=ids).logits[:, :-1].double()
    target = labels[:, 1:]
    keep = target != -100
    nll = -logits.log_softmax(-1).gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    assert metrics["val/ppl"] == pytest.approx(math.exp(nll[keep].mean().item()), rel=1e-5)
    assert metrics["val/acc"] == pytest.approx((logits.argmax(-1) == target)[keep].double().mean().item(), abs=1e-7)
    assert metrics["val/loss"] == pytest.approx(nll[keep].mean().item(), rel=1e-5)

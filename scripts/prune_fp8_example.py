"""A tiny FP8 DeepSeek-V3, pruned in its own format with AIMER (docs/guides/quantized-checkpoint.md).

A float DeepSeek-V3 built from a config (4 layers, 16 routed experts, hidden 256) is written as FP8 in 32x32 blocks by
``lp.quantize_checkpoint``, scored from its weights (AIMER), pruned by a quarter with ``lp.prune_checkpoint``
(verified layer by layer against the masked source) and reloaded by transformers (which dequantizes it on a CPU).

    python scripts/prune_fp8_example.py --out outputs/fp8-example
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402

import lightprune as lp  # noqa: E402
from lightprune.testing.tiny import tiny_model  # noqa: E402


def _stored(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(file, "pt") as handle:
            out.update({key: handle.get_tensor(key) for key in handle.keys()})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/fp8-example"))
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM

    float_dir, fp8_dir, pruned_dir = args.out / "bf16", args.out / "fp8", args.out / "fp8-pruned"
    model = tiny_model("deepseek_v3", seed=0, num_hidden_layers=4, hidden_size=256, intermediate_size=256,
                       moe_intermediate_size=64, n_routed_experts=16, n_group=4, topk_group=2, q_lora_rank=64,
                       kv_lora_rank=32, qk_rope_head_dim=32, num_attention_heads=4,
                       num_key_value_heads=4).to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(float_dir)
    lp.quantize_checkpoint(float_dir, fp8_dir, block=(32, 32), overwrite=True)
    config = json.loads((fp8_dir / "config.json").read_text())
    print(f"FP8 checkpoint: {fp8_dir} (quantization_config {config['quantization_config']}), "
          f"{config['n_routed_experts']} routed experts a layer")

    plan = lp.select_experts(lp.score_weights(fp8_dir, "aimer"), ratio=0.25)
    result = lp.prune_checkpoint(fp8_dir, plan, pruned_dir, overwrite=True)
    pruned_config = json.loads((pruned_dir / "config.json").read_text())
    print(f"pruned: {pruned_dir}, {pruned_config['n_routed_experts']} routed experts a layer, "
          f"quant_method {pruned_config['quantization_config']['quant_method']!r}, "
          f"verified (largest difference {result.verification['max_abs_diff']})")

    before, after = _stored(fp8_dir), _stored(pruned_dir)
    same = all(torch.equal(after[f"model.layers.{layer}.mlp.experts.{new}.{name}"].view(torch.uint8),
                           before[f"model.layers.{layer}.mlp.experts.{old}.{name}"].view(torch.uint8))
               for layer, kept in plan.keep.items() for new, old in enumerate(kept)
               for name in ("gate_proj.weight", "gate_proj.weight_scale_inv", "down_proj.weight"))
    print(f"kept experts' FP8 bytes and scales equal the source's: {same}")

    source = AutoModelForCausalLM.from_pretrained(fp8_dir).eval()
    pruned = AutoModelForCausalLM.from_pretrained(pruned_dir).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), lp.mask_experts(source, plan):
        masked = source(ids).logits
    with torch.no_grad():
        diff = (pruned(ids).logits - masked).abs().max().item()
    print(f"transformers' reload of the pruned FP8 checkpoint against the masked source: largest logit difference "
          f"{diff}")
    return 0 if same and diff == 0.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

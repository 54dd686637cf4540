"""Fine-tuning: the LightningModule (`MoECausalLM`), peft adapters (LoRA, IA3), Houlsby adapters,
4-bit quantisation (QLoRA), optimizers and schedulers, and checkpoint sources (`sources`: names such as
``testbed:text-small`` that packages register).

May import: models, export (it loads pruned checkpoints), stream (``sequential=True``) and the shared leaves; never testbed (it registers
its own source), callbacks or above.
"""

from lightprune.finetune.adapters import (
                                          AdapterSpec,
                                          apply_adapter,
                                          merged_router_weights,
                                          remove_adapters,
                                          router_is_trainable,
)
from lightprune.finetune.causal_lm import MoECausalLM
from lightprune.models.unwrap import base_model_of

__all__ = ["MoECausalLM", "AdapterSpec", "apply_adapter", "remove_adapters", "merged_router_weights",
           "router_is_trainable", "base_model_of"]

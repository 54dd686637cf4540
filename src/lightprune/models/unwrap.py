"""The transformers model under whatever wraps it: peft's wrappers or a LightningModule.

Every module that needs the family's own model calls [`base_model_of`][]; adapters stay active in it.
A wrapper's class can only exist once its package is imported, so peft and Lightning are looked up in
``sys.modules`` rather than imported here (importing them costs seconds and hundreds of MB).
"""

from __future__ import annotations

import sys

from torch import nn

__all__ = ["base_model_of"]


def base_model_of(model: nn.Module) -> nn.Module:
    """The transformers model under any peft wrapper (or a MoECausalLM's model); adapters stay active in it."""
    peft_model = getattr(sys.modules.get("peft"), "PeftModel", None)
    if peft_model is not None and isinstance(model, peft_model):
        return model.get_base_model()
    tuners = sys.modules.get("peft.tuners.tuners_utils")
    if tuners is not None and isinstance(model, tuners.BaseTuner):
        return model.model
    lightning_module = getattr(sys.modules.get("lightning.pytorch"), "LightningModule", None)
    if lightning_module is not None and isinstance(model, lightning_module) \
            and isinstance(getattr(model, "model", None), nn.Module):
        return base_model_of(model.model)
    return model

"""The transformers model under whatever wraps it: peft's wrappers or a LightningModule.

Every module that needs the family's own model calls :func:`base_model_of`; adapters stay active in it.
"""

from __future__ import annotations

from torch import nn

__all__ = ["base_model_of"]


def base_model_of(model: nn.Module) -> nn.Module:
    """The transformers model under any peft wrapper (or a MoECausalLM's model); adapters stay active in it."""
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTuner

    if isinstance(model, PeftModel):
        return model.get_base_model()
    if isinstance(model, BaseTuner):
        return model.model
    from lightning.pytorch import LightningModule

    if isinstance(model, LightningModule) and isinstance(getattr(model, "model", None), nn.Module):
        return base_model_of(model.model)
    return model

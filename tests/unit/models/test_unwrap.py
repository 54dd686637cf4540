"""base_model_of unwraps peft's wrappers and a LightningModule's ``model``, and on a plain model imports neither
package (each costs seconds and hundreds of MB; a wrapper cannot exist before its package is imported)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lightprune.models.unwrap import base_model_of


@pytest.mark.exhaustive
def test_a_plain_model_imports_neither_peft_nor_lightning() -> None:
    code = ("import sys; from lightprune.testing.tiny import tiny_model; from lightprune.models.unwrap import "
            "base_model_of; m = tiny_model('qwen3_moe'); assert base_model_of(m) is m; "
            "print(sorted(p for p in ('peft', 'lightning') if p in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_peft_and_lightning_wrappers_are_unwrapped(tiny) -> None:
    from lightning.pytorch import LightningModule
    from peft import LoraConfig, get_peft_model

    model = tiny("qwen3_moe")
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    assert base_model_of(peft_model) is model
    assert base_model_of(peft_model.base_model) is model  # the LoraModel tuner

    class Wrapper(LightningModule):
        def __init__(self, inner):
            super().__init__()
            self.model = inner

    assert base_model_of(Wrapper(peft_model)) is model

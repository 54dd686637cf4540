"""load_pruned checks its arguments before anything is read, each refusal one line naming the value and the choices
(before, ``dtype='float17'`` passed through transformers' own line, which names neither); a width export's plan or
manifest that is not a regular file is said, never loaded as a dense model."""

from __future__ import annotations

import pytest
import torch

import lightprune as lp
from lightprune.export.load import check_device_map, check_dtype
from lightprune.export.width_format import read_width_manifest

NOWHERE = "/nonexistent/lightprune-checkpoint"  # checked first: the folder is never looked at


@pytest.mark.parametrize("kwargs, said", [
    ({"dtype": "float17"}, r"^load_pruned: dtype 'float17' is not a dtype weights load in \(did you mean 'float16'\?\); "
                           r"choose one of 'auto' \(what config.json records\), 'float32', 'bfloat16', 'float16', "
                           r"'float64' \(or the torch.dtype\)$"),
    ({"dtype": "nn"}, r"dtype 'nn' is not a dtype weights load in; choose one of 'auto'"),  # torch.nn: no dtype
    ({"dtype": torch.int8}, r"dtype torch.int8 is not a dtype weights load in"),
    ({"dtype": {"text_config": "bf16"}}, r"dtype\['text_config'\] 'bf16' is not .* \(did you mean 'bfloat16'\?\)"),
    ({"attention_backend": "sdp"}, r"^load_pruned: attention_backend 'sdp' is not a path-attention backend \(did you "
                                   r"mean 'sdpa'\?\); choose one of 'auto', 'triton', 'flex', 'span', 'sdpa'"),
    ({"device_map": "autoo"}, r"^load_pruned: device_map 'autoo' is not a placement transformers takes \(did you mean "
                              r"'auto'\?\); choose one of 'auto', 'balanced', 'balanced_low_0', 'sequential', a device"),
    ({"device_map": "gpu7"}, r"device_map 'gpu7' is not a placement transformers takes; choose one of"),
    ({"device_map": -1}, r"device_map -1 is not a placement"),
    ({"device_map": {"model": "cpx"}}, r"device_map\['model'\] 'cpx' is not a placement .*; give a device"),
    ({"experts_implementation": "grouped"}, r"^load_pruned: experts_implementation 'grouped' is not an experts kernel "
                                            r"transformers has \(did you mean 'grouped_mm'\?\); choose one of 'eager'"),
])
def test_a_bad_argument_is_refused_naming_the_value_and_the_choices(kwargs, said) -> None:
    with pytest.raises(ValueError, match=said):
        lp.load_pruned(NOWHERE, **kwargs)


def test_the_values_transformers_takes_pass() -> None:
    for dtype in (None, "auto", "float32", "bfloat16", "half", torch.float64, {"text_config": torch.bfloat16}):
        check_dtype(dtype)
    for device_map in (None, "auto", "sequential", "cpu", "cuda:1", 0, torch.device("cpu"),
                       {"": "cpu", "lm_head": "disk", "model.layers.0": 0}):
        check_device_map(device_map)
    with pytest.raises(FileNotFoundError):  # the arguments pass: on to the folder
        lp.load_pruned(NOWHERE, dtype="bfloat16", device_map="cpu", attention_backend="flex",
                       experts_implementation="eager")


def test_a_width_manifest_that_is_not_a_file_is_said(tmp_path) -> None:
    (tmp_path / "lightprune_export.json").mkdir()
    with pytest.raises(IsADirectoryError, match=r"^width manifest file .*lightprune_export\.json' is a directory"):
        read_width_manifest(tmp_path)
    (tmp_path / "lightprune_export.json").rmdir()
    assert read_width_manifest(tmp_path) == {"align": 64}  # none there: a plan dropped in by hand

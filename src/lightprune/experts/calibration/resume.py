"""Resumable calibration state: the accumulators plus what they were accumulated from.

An interrupted calibration resumes from its saved accumulators only when the rerun is the same
calibration: a state file records

- ``setup``: the subsets, the criteria and the low-attention quantile;
- ``model``: the model type, the routed experts per MoE layer and a float64 sum of every router's
  weight (two different checkpoints of one architecture differ there);
- ``digest``: a chain of SHA-256 digests over the batches accumulated so far, d_n = H(d_{n-1} || H(batch_n))
  with H(batch) over every tensor's name, dtype, shape and bytes (ids, masks, pixels), so the first n
  batches of the rerun must be exactly the batches the state holds (the same file, tokenizer and batch
  arguments), checked before any of them is skipped.

A mismatch is a :class:`CalibrationStateError` that names what differs and says how to start afresh; a
file that is not such a state (garbage, another program's, an older format) is refused the same way.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightprune.core.distributed import gathered
from lightprune.models import find_moe_layers
from lightprune.models.unwrap import base_model_of

__all__ = ["CalibrationStateError", "STATE_FORMAT", "batch_digest", "chain_digest", "model_fingerprint",
           "save_state", "load_state", "check_model", "check_batches"]

STATE_FORMAT = "lightprune-calibration-state"
_EMPTY = hashlib.sha256(b"").hexdigest()
_FRESH = "delete it or set resume: false (ExpertStats(resume=False)) to start afresh"


class CalibrationStateError(ValueError):
    """A saved calibration state that cannot be resumed by this run; the message names the file and why."""


def batch_digest(batch: Mapping[str, Any]) -> str:
    """SHA-256 over every tensor of ``batch`` (name, dtype, shape, bytes), in key order."""
    h = hashlib.sha256()
    for key in sorted(batch):
        value = batch[key]
        if not isinstance(value, torch.Tensor):
            continue
        data = value.detach().cpu().contiguous()
        h.update(f"{key}|{data.dtype}|{tuple(data.shape)}|".encode())
        h.update(data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return h.hexdigest()


def chain_digest(previous: str | None, batch: Mapping[str, Any]) -> str:
    """d_n = SHA-256(d_{n-1} || H(batch_n)); ``previous=None`` starts the chain."""
    return hashlib.sha256(((previous or _EMPTY) + batch_digest(batch)).encode()).hexdigest()


@torch.no_grad()
def model_fingerprint(model: nn.Module) -> dict[str, Any]:
    """Model type, routed experts per MoE layer and a float64 sum of each router's weight."""
    base = base_model_of(model)
    layers = find_moe_layers(base)
    routers = [p for layer in layers for p in layer.router.parameters()]
    with gathered(routers):  # ZeRO-3: the routers only
        sums = {str(layer.index): float(sum(p.detach().double().sum() for p in layer.router.parameters()))
                for layer in layers}
    return {"model_type": getattr(base.config, "model_type", None),
            "experts_per_layer": {str(layer.index): layer.num_experts for layer in layers},
            "router_sums": sums}


def save_state(path: str | os.PathLike, observer_state: Mapping[str, Any], setup: Mapping[str, Any],
               model: Mapping[str, Any], digest: str | None) -> None:
    """Write the state atomically (a temporary file renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"format": STATE_FORMAT, "version": 1, "observer": dict(observer_state), "setup": dict(setup),
                "model": dict(model), "digest": digest}, tmp)
    os.replace(tmp, path)


def load_state(path: str | os.PathLike, setup: Mapping[str, Any]) -> dict[str, Any]:
    """The saved state at ``path``, after checking it is one and was made with the same ``setup``."""
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same answer
        raise CalibrationStateError(f"calibration state {str(path)!r} cannot be read ({type(err).__name__}): it is "
                                    f"not a lightprune calibration state or it is damaged; {_FRESH}") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise CalibrationStateError(f"calibration state {str(path)!r} is not a lightprune calibration state of this "
                                    f"version (no fingerprint of its data and model); {_FRESH}")
    differs = {k: (state["setup"].get(k), v) for k, v in setup.items() if state["setup"].get(k) != v}
    if differs:
        said = "; ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in differs.items())
        raise CalibrationStateError(f"calibration state {str(path)!r} was made with another setup ({said}); {_FRESH}")
    return state


def check_model(path: str | os.PathLike, state: Mapping[str, Any], model: Mapping[str, Any]) -> None:
    """The saved state's model fingerprint must equal ``model`` (this run's)."""
    saved = state["model"]
    for key in ("model_type", "experts_per_layer", "router_sums"):
        if saved.get(key) != model.get(key):
            what = {"model_type": "model type", "experts_per_layer": "experts per layer",
                    "router_sums": "router weights"}[key]
            raise CalibrationStateError(f"calibration state {str(path)!r} was made with another model (its {what} "
                                        f"differ: saved {saved.get(key)!r}, now {model.get(key)!r}); {_FRESH}")


def check_batches(path: str | os.PathLike, state: Mapping[str, Any], batches: Iterable[Mapping[str, Any]]) -> None:
    """The first ``batches_seen`` batches of this run must be the ones the state accumulated."""
    done = int(state["observer"]["batches_seen"])
    digest, seen = None, 0
    for batch in batches:
        if seen == done:
            break
        digest, seen = chain_digest(digest, batch), seen + 1
    if seen < done:
        raise CalibrationStateError(f"calibration state {str(path)!r} holds {done} batches, but this run's calibration "
                                    f"data has only {seen}: it is not the data of the interrupted run; {_FRESH}")
    if done and digest != state["digest"]:
        raise CalibrationStateError(f"calibration state {str(path)!r}: this run's first {done} calibration batches "
                                    "differ from the ones it accumulated (another file, tokenizer, order or batch "
                                    f"arguments); {_FRESH}")

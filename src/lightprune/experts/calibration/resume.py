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

A mismatch is a `CalibrationStateError` that names what differs and says how to start afresh; a
file that is not such a state (garbage, another program's, an older format) is refused the same way, and so is one
whose fields are well-formed but wrong, naming the field (`check_fields` when it is read, before anything is
built: a field missing or of another type, layers or expert counts other than its fingerprint's, negative or
fractional counts, a sum that is not float64 or not finite, counts that disagree with each other or with
``batches_seen``; `check_observer_state` once the job's observer exists and before anything is loaded into it:
the statistics, layers and shapes the job collects, and every token's top-k counted in ``frequency``;
`check_batches`: a ``batches_seen`` whose digest is that of another number of this run's batches).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightprune.core.distributed import gathered
from lightprune.core.errors import listed
from lightprune.core.jsonio import int_key
from lightprune.core.paths import through_file, write_atomically
from lightprune.experts.calibration.observer import ExpertObserver
from lightprune.models import find_moe_layers
from lightprune.models.unwrap import base_model_of

__all__ = ["CalibrationStateError", "STATE_FORMAT", "batch_digest", "chain_digest", "model_fingerprint",
           "save_state", "load_state", "check_fields", "check_observer_state", "check_model", "check_batches"]

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
    """Write the state atomically (`write_atomically`: a temporary file renamed into
    place, removed on any failure, which names the file and the cause; the state saved before is kept)."""
    state = {"format": STATE_FORMAT, "version": 1, "observer": dict(observer_state), "setup": dict(setup),
             "model": dict(model), "digest": digest}
    write_atomically(path, through_file(lambda handle: torch.save(state, handle)), "calibration state")


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
    check_fields(path, state)
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
    """The first ``batches_seen`` batches of this run must be the ones the state accumulated. When they are not, the
    digests of this run's other first batches (up to ``max(batches_seen, 1024)`` more) tell a changed
    ``batches_seen`` (the state's digest is that of another number of them) from other data."""
    done = int(state["observer"]["batches_seen"])
    iterator = iter(batches)
    digests: list[str] = []
    for batch in itertools.islice(iterator, done):
        digests.append(chain_digest(digests[-1] if digests else None, batch))
    seen, digest = len(digests), digests[-1] if digests else None
    if seen == done and (not done or digest == state["digest"]):
        return
    at = digests.index(state["digest"]) + 1 if state["digest"] in digests else None
    if at is None and seen == done:  # further along this run's data
        for batch in itertools.islice(iterator, max(done, 1024)):
            digest, seen = chain_digest(digest, batch), seen + 1
            if digest == state["digest"]:
                at = seen
                break
    if at is not None:
        raise _refuse(path, "observer.batches_seen", f"is {done}, but the state's digest is that of this run's first "
                      f"{at} calibration batches: the count disagrees with the batches accumulated")
    if seen < done:
        raise CalibrationStateError(f"calibration state {str(path)!r} holds {done} batches, but this run's calibration "
                                    f"data has only {seen}: it is not the data of the interrupted run; {_FRESH}")
    if done and digest != state["digest"]:
        raise CalibrationStateError(f"calibration state {str(path)!r}: this run's first {done} calibration batches "
                                    "differ from the ones it accumulated (another file, tokenizer, order or batch "
                                    f"arguments); {_FRESH}")


# ---------------------------------------------------------------------------------------------------- the fields
#: the sums of a layer that count tokens or samples (whole numbers >= 0), by state group
_COUNTS = {"layers": ("tokens", "samples", "frequency"), "merging": ("tokens",)}
_HEX = frozenset("0123456789abcdef")


def _shown(value: Any) -> str:
    text = repr(value)
    return (text if len(text) <= 60 else text[:57] + "...") + f" ({type(value).__name__})"


def _refuse(path: str | os.PathLike, field: str, problem: str) -> CalibrationStateError:
    return CalibrationStateError(f"calibration state {str(path)!r}: field {field} {problem}; {_FRESH}")


def _field(path: str | os.PathLike, parent: Mapping[str, Any], key: str, field: str) -> Any:
    if key not in parent:
        raise _refuse(path, field, "is missing")
    return parent[key]


def _mapping(path: str | os.PathLike, value: Any, field: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise _refuse(path, field, f"is {_shown(value)}, not a dict")
    return value


def _count(path: str | os.PathLike, value: Any, field: str) -> int:
    """A whole number >= 0 stored as a Python int (what `save_state` writes)."""
    if type(value) is not int:
        raise _refuse(path, field, f"is {_shown(value)}; a count is a whole number (int)")
    if value < 0:
        raise _refuse(path, field, f"is {value}; a count cannot be negative")
    return value


def _layer_keys(path: str | os.PathLike, value: Any, field: str) -> dict[int, Any]:
    """{layer index: item} of a per-layer dict whose keys are layer indices (ints or decimal strings), one per layer."""
    found: dict[int, Any] = {}
    for key, item in _mapping(path, value, field).items():
        index = int_key(key)
        if index is None or index < 0:
            raise _refuse(path, field, f"has the key {_shown(key)}, not a layer index")
        if index in found:
            raise _refuse(path, field, f"names layer {index} twice")
        found[index] = item
    return found


def check_fields(path: str | os.PathLike, state: Mapping[str, Any]) -> None:
    """Every field of a read state (its ``format`` already checked) well-formed and consistent with the others, before
    anything is built: a `CalibrationStateError` naming the file and the first field that is not."""
    version = _field(path, state, "version", "version")
    if type(version) is not int or version != 1:
        raise _refuse(path, "version", f"is {_shown(version)}; this lightprune reads version 1")
    setup = _mapping(path, _field(path, state, "setup", "setup"), "setup")
    subsets = _field(path, setup, "subsets", "setup.subsets")
    if not isinstance(subsets, list) or not subsets or not all(isinstance(s, str) for s in subsets) \
            or len(set(subsets)) != len(subsets):
        raise _refuse(path, "setup.subsets", f"is {_shown(subsets)}, not a list of distinct subset names")
    criteria = _field(path, setup, "criteria", "setup.criteria")
    if criteria is not None and (not isinstance(criteria, list) or not criteria
                                 or not all(isinstance(c, str) for c in criteria)):
        raise _refuse(path, "setup.criteria", f"is {_shown(criteria)}, not None or a list of criterion names")
    quantile = _field(path, setup, "low_attn_quantile", "setup.low_attn_quantile")
    if type(quantile) is not float or not 0.0 < quantile <= 0.5:
        raise _refuse(path, "setup.low_attn_quantile", f"is {_shown(quantile)}, not a float in (0, 0.5]")
    experts = _check_fingerprint(path, _mapping(path, _field(path, state, "model", "model"), "model"))
    observer = _mapping(path, _field(path, state, "observer", "observer"), "observer")
    batches = _count(path, _field(path, observer, "batches_seen", "observer.batches_seen"), "observer.batches_seen")
    digest = _field(path, state, "digest", "digest")
    if batches == 0 and digest is not None:
        raise _refuse(path, "digest", "holds a digest, but observer.batches_seen is 0: no batch to digest")
    if batches and not (isinstance(digest, str) and len(digest) == 64 and set(digest) <= _HEX):
        raise _refuse(path, "digest", f"is {_shown(digest)}, not the SHA-256 hex digest of the first {batches} batches")
    groups = {key: value for key, value in observer.items() if key != "batches_seen"}
    if "layers" not in groups:
        raise _refuse(path, "observer.layers", "is missing")
    for group, value in groups.items():
        if not isinstance(group, str):
            raise _refuse(path, "observer", f"has the key {_shown(group)}, not a group of sums")
        layers = _layer_keys(path, value, f"observer.{group}")
        if set(layers) != set(experts):
            raise _refuse(path, f"observer.{group}", f"holds layers {listed(sorted(layers))}, its model fingerprint "
                          f"(model.experts_per_layer) MoE layers {listed(sorted(experts))}")
        for index, sums in layers.items():
            where = f"observer.{group}[{index}]"
            for name, tensor in _mapping(path, sums, where).items():
                if not isinstance(tensor, torch.Tensor):
                    raise _refuse(path, f"{where}.{name}", f"is {_shown(tensor)}, not a tensor of sums")
    _check_counts(path, observer, len(subsets), experts)


def _check_fingerprint(path: str | os.PathLike, model: Mapping[str, Any]) -> dict[int, int]:
    """The model fingerprint's fields; returns {MoE layer: routed experts}."""
    model_type = _field(path, model, "model_type", "model.model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise _refuse(path, "model.model_type", f"is {_shown(model_type)}, not a model type")
    experts = _layer_keys(path, _field(path, model, "experts_per_layer", "model.experts_per_layer"),
                          "model.experts_per_layer")
    if not experts:
        raise _refuse(path, "model.experts_per_layer", "is empty: a calibrated model has MoE layers")
    for index, count in experts.items():
        if _count(path, count, f"model.experts_per_layer[{index}]") < 1:
            raise _refuse(path, f"model.experts_per_layer[{index}]", "is 0; an MoE layer has routed experts")
    sums = _layer_keys(path, _field(path, model, "router_sums", "model.router_sums"), "model.router_sums")
    if set(sums) != set(experts):
        raise _refuse(path, "model.router_sums", f"holds layers {listed(sorted(sums))}, model.experts_per_layer "
                      f"{listed(sorted(experts))}")
    for index, value in sums.items():
        if type(value) is not float or not math.isfinite(value):
            raise _refuse(path, f"model.router_sums[{index}]", f"is {_shown(value)}, not a finite float")
    return experts


def _check_counts(path: str | os.PathLike, observer: Mapping[str, Any], subsets: int,
                  experts: Mapping[int, int] | None) -> None:
    """The sums (float64, finite), the counts among them (whole, >= 0, one per subset: ``tokens``, ``samples`` [U],
    ``frequency`` [U, E] with E the layer's experts when ``experts`` gives them; merging ``tokens`` a scalar) and how
    they agree: samples <= tokens, a merging token count between the largest subset's and the sum of all (the tokens in
    some subset), every count 0 when no batch was seen and not every count 0 when one was."""
    batches = observer["batches_seen"]
    for group in sorted((g for g in observer if g != "batches_seen"), key=lambda g: g != "layers"):  # layers first
        for index, sums in _layer_keys(path, observer[group], f"observer.{group}").items():
            where = f"observer.{group}[{index}]"
            for name, tensor in sums.items():
                field = f"{where}.{name}"
                if tensor.dtype != torch.float64:
                    raise _refuse(path, field, f"is {tensor.dtype}; calibration sums are torch.float64")
                if not bool(torch.isfinite(tensor).all()):
                    raise _refuse(path, field, "holds NaN or inf; a sum of finite statistics is finite")
                if batches == 0 and bool((tensor != 0).any()):
                    raise _refuse(path, field, "is not 0, but observer.batches_seen is 0: nothing was summed")
            for name in _COUNTS.get(group, ()):
                if name == "frequency" and name not in sums:
                    continue  # collected only with the token sums' criteria
                tensor = _field(path, sums, name, f"{where}.{name}")
                shape = {"frequency": [subsets, experts[index]] if experts else None,
                         "tokens": [] if group == "merging" else [subsets], "samples": [subsets]}[name]
                if shape is not None and list(tensor.shape) != shape:
                    raise _refuse(path, f"{where}.{name}", f"has shape {list(tensor.shape)}, expected {shape} "
                                  "(one per subset of setup.subsets" + (" and routed expert" if
                                                                       name == "frequency" else "") + ")")
                if bool((tensor < 0).any()):
                    raise _refuse(path, f"{where}.{name}", f"holds {float(tensor.min()):g}; a count cannot be "
                                  "negative")
                if not bool((tensor == tensor.round()).all()):
                    raise _refuse(path, f"{where}.{name}", "holds a fraction; it counts tokens or samples")
            if group == "layers":
                tokens, samples = sums["tokens"], sums["samples"]
                if bool((samples > tokens).any()):
                    raise _refuse(path, f"{where}.samples", f"is {samples.tolist()}, above the tokens counted "
                                  f"({where}.tokens {tokens.tolist()}): a sample counts once it has a token")
                if batches and not bool(tokens.any()):
                    raise _refuse(path, f"{where}.tokens", f"is all 0, but observer.batches_seen is {batches}: "
                                  "every batch seen counts its tokens")
            elif group == "merging":
                tokens = _layer_keys(path, observer["layers"], "observer.layers")[index]["tokens"]
                merged = float(sums["tokens"])
                if not float(tokens.max()) <= merged <= float(tokens.sum()):
                    raise _refuse(path, f"{where}.tokens", f"is {merged:g}, but the subsets count {tokens.tolist()} "
                                  f"tokens (observer.layers[{index}].tokens): it counts those in some subset")


def check_observer_state(path: str | os.PathLike, saved: Mapping[str, Any], observer: ExpertObserver) -> None:
    """``saved`` (an observer state: a file's, a Lightning checkpoint's) is what ``observer`` (this job's, nothing
    loaded yet) collects: the same groups, MoE layers, sums, shapes and dtypes, its counts whole and consistent
    (`check_fields`' checks of the observer), and each layer's ``frequency`` the layer's top-k times its
    tokens in every subset (every counted token routed to k experts). ``path`` names the state in the error."""
    if not isinstance(saved, Mapping) or "batches_seen" not in saved:
        raise _refuse(path, "observer.batches_seen", "is missing")
    _count(path, saved["batches_seen"], "observer.batches_seen")
    expected = observer.state_dict()
    job = f"this job collects {list(observer.criteria) + list(observer.merging)}"
    extra, missing = sorted(set(saved) - set(expected), key=str), sorted(set(expected) - set(saved))
    if extra:
        raise _refuse(path, f"observer.{extra[0]}", f"is not a group of sums of this job ({job})")
    if missing:
        raise _refuse(path, f"observer.{missing[0]}", f"is missing ({job})")
    for group, layers in expected.items():
        if group == "batches_seen":
            continue
        found = _layer_keys(path, saved[group], f"observer.{group}")
        if set(found) != set(layers):
            raise _refuse(path, f"observer.{group}", f"holds layers {listed(sorted(found))}, this model's MoE layers "
                          f"are {listed(sorted(layers))}")
        for index, sums in layers.items():
            where = f"observer.{group}[{index}]"
            held = _mapping(path, found[index], where)
            extra = sorted(set(held) - set(sums), key=str)
            if extra:
                raise _refuse(path, f"{where}.{extra[0]}", f"is not a statistic of this job ({job})")
            for name, want in sums.items():
                have = _field(path, held, name, f"{where}.{name}")
                if not isinstance(have, torch.Tensor):
                    raise _refuse(path, f"{where}.{name}", f"is {_shown(have)}, not a tensor of sums")
                if have.shape != want.shape:
                    raise _refuse(path, f"{where}.{name}", f"has shape {list(have.shape)}, this job's is "
                                  f"{list(want.shape)} ({len(observer.subsets)} subsets, "
                                  f"{observer.statistics[index].counts.num_experts} experts)")
                if have.dtype != want.dtype:
                    raise _refuse(path, f"{where}.{name}", f"is {have.dtype}; this job's sums are {want.dtype}")
    experts = {layer.index: layer.num_experts for layer in observer.layers}
    _check_counts(path, saved, len(observer.subsets), experts)
    for layer in observer.layers:
        sums = _layer_keys(path, saved["layers"], "observer.layers")[layer.index]
        if "frequency" not in sums:
            continue
        routed, tokens = sums["frequency"].sum(dim=-1), sums["tokens"] * layer.top_k
        if not torch.equal(routed, tokens):
            raise _refuse(path, f"observer.layers[{layer.index}].frequency", f"sums to {routed.tolist()} routed "
                          f"tokens per subset, but observer.layers[{layer.index}].tokens {sums['tokens'].tolist()} "
                          f"times top_k {layer.top_k} is {tokens.tolist()}: the counts disagree with the sums")

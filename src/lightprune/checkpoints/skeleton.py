"""A checkpoint's model on the meta device, with chosen modules read in from the checkpoint and released again:
[`Skeleton`][], what every out-of-core path (streamed scores, streamed pruning and its verification, layer by
layer calibration) is built on.

The model is built from the checkpoint's config under ``torch.device("meta")`` (no weights allocated, no random
initialisation), with the stock transformers class, or for a non-uniform lightprune checkpoint its resizing
subclass. Non-persistent buffers (rotary frequencies) are computed on the CPU as transformers' loader does
(``initialize_weights`` over meta parameters, which it leaves alone).

[`Skeleton.load`][] makes modules resident: the checkpoint tensors whose model name falls under them are read
(lazily, through safetensors' memory map) and converted by transformers' own weight conversions
(``conversion_mapping``: per-expert tensors on disk fused into ``gate_up_proj`` / ``down_proj``, renamings),
the same code ``from_pretrained`` runs, one module at a time. Every parameter and persistent buffer of a loaded
module must come from the checkpoint (tied weights follow their source); a missing, mis-shaped or unconvertible
tensor raises ``ValueError`` naming it. [`Skeleton.release`][] puts them back on the meta device, so the
memory held is that of the resident modules (with a [`ReadPool`][..pool.ReadPool], also the last
release's storages until the next load has read into them or dropped them).
"""

from __future__ import annotations

import contextlib
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from lightprune.checkpoints.classes import base_class_for_config, resizing_class
from lightprune.checkpoints.config_against_weights import majority_dtype
from lightprune.checkpoints.contents import check_contents
from lightprune.checkpoints.conversions import concatenates_fused, standard_merge, transposed_dim
from lightprune.checkpoints.device import DeviceCopies, streaming_device
from lightprune.checkpoints.mtp import config_with_mtp, mtp_alias, mtp_layers
from lightprune.checkpoints.pool import ReadPool, trim_freed_memory
from lightprune.checkpoints.read_ahead import ReadAhead
from lightprune.checkpoints.reader import Checkpoint
from lightprune.models.resize import experts_per_layer
from lightprune.core.notices import quiet_progress
from lightprune.models.dtypes import LOAD_DTYPES, dtype_names

__all__ = ["Skeleton"]

#: the expert number of a per-expert checkpoint key (``...experts.<n>.<name>``)
EXPERT_INDEX = re.compile(r"(?:^|\.)experts\.(\d+)\.")


def checkpoint_dtype(checkpoint: Checkpoint) -> torch.dtype:
    """The floating dtype of most of the checkpoint's bytes (what its weights are stored in; float32 without any
    floating tensor)."""
    return majority_dtype(checkpoint)[0] or torch.float32


class Skeleton:
    """``model``: the checkpoint's model on the meta device; [`load`][] / [`release`][] / [`resident`][]
    move modules (by their names in ``model``) in and out of memory. ``dtype``: the weights' dtype (default the
    checkpoint's), ``device``: where loaded tensors go and the model computes (the CPU, or a GPU: read into pinned
    memory and copied on a stream of their own, `lightprune.checkpoints.device`); ``pool``: released tensors'
    memory to read the next loads into ([`ReadPool`][...pool.ReadPool], on the CPU; shared by
    skeletons that load in turn);
    ``mtp``: build the checkpoint's multi-token-prediction layers as further decoder layers
    (`lightprune.checkpoints.mtp`), for the paths that score, prune and verify them."""

    def __init__(self, checkpoint: Checkpoint, *, dtype: torch.dtype | None = None,
                 device: torch.device | str = "cpu", pool: ReadPool | None = None, mtp: bool = False):
        self.checkpoint = checkpoint
        self.dtype = dtype or checkpoint_dtype(checkpoint)
        if self.dtype not in LOAD_DTYPES.values():  # float8 weights: no model computes in them
            stored, share = majority_dtype(checkpoint)
            said = str(self.dtype).removeprefix("torch.")
            whose = f"its weights are stored in {said} ({share:.0%} of the floating tensor bytes)" \
                if dtype is None and stored == self.dtype else f"dtype {said} was asked for"
            raise ValueError(f"checkpoint {str(checkpoint.path)!r}: {whose}, which lightprune does not compute in "
                             f"(it computes in {dtype_names()}); re-save the checkpoint in one of them")
        self.device = streaming_device(device)
        self.copies = DeviceCopies(self.device)
        #: where released tensors go and loads read into (None: freed, new memory)
        self.pool = pool if self.device.type == "cpu" else None
        #: read the next layer in a background thread when told (:meth:`prefetch`): on a GPU, into pinned memory while
        #: this layer's kernels are queued (:mod:`lightprune.checkpoints.read_ahead`); never with a pool
        self.read_ahead = self.device.type != "cpu"
        self._ahead: ReadAhead | None = None
        #: the checkpoint's multi-token-prediction layers (their tensors are never unexpected ones), and those the
        #: model builds as further decoder layers (``mtp``)
        self.mtp_layers = mtp_layers(checkpoint.path, checkpoint.config, checkpoint.keys())
        self.built_mtp_layers = self.mtp_layers if mtp else []
        config = config_with_mtp(checkpoint.config, self.built_mtp_layers)
        cls = base_class_for_config(config)
        if experts_per_layer(config):
            cls = resizing_class(cls)
        with torch.device("meta"):
            self.model = cls._from_config(config, dtype=self.dtype)
        self.model.eval()
        for name, buffer in list(self.model.named_non_persistent_buffers()):
            owner, _, attr = name.rpartition(".")
            self.model.get_submodule(owner)._buffers[attr] = torch.empty_like(buffer, device="cpu")
        self.model.initialize_weights()  # the non-persistent buffers' values; meta parameters stay as they are
        if self.device.type != "cpu":  # computed on the CPU as transformers' loader does, then where the model runs
            for name, buffer in list(self.model.named_non_persistent_buffers()):
                owner, _, attr = name.rpartition(".")
                self.model.get_submodule(owner)._buffers[attr] = buffer.to(self.device)
        #: the model's state-dict names (parameters and persistent buffers): loading and releasing never change them
        self._names = list(self.model.state_dict(keep_vars=True))
        #: {model tensor name: the checkpoint keys it is converted from}
        self.sources = self._map_checkpoint_keys()
        check_contents(self)  # every tensor the model needs, nothing else, in shapes that fit: before any read

    # ------------------------------------------------------------------ the key map
    def _map_checkpoint_keys(self) -> dict[str, list[str]]:
        """{model tensor name: checkpoint keys it is converted from}, through transformers' conversion mapping."""
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        self._mapping = get_model_conversion_mapping(self.model)
        renamings = [m for m in self._mapping if isinstance(m, WeightRenaming)]
        converters = [m for m in self._mapping if isinstance(m, WeightConverter)]
        self._converters = {pattern: c for c in converters for pattern in c.source_patterns}
        own = self.model.state_dict(keep_vars=True)
        prefix = self.model.base_model_prefix
        sources: dict[str, list[str]] = defaultdict(list)
        #: the checkpoint keys the model has no tensor for (copied unchanged by a streamed export)
        self.unmatched: list[str] = []
        #: {checkpoint key: (the model tensor it becomes, the converter's source pattern, None for a rename)}
        self.targets: dict[str, tuple[str, str | None]] = {}
        #: {unmatched checkpoint key: its name after transformers' renamings}
        self.renamed: dict[str, str] = {}
        count = getattr(self.checkpoint.config, "num_hidden_layers", 0)
        for key in self.checkpoint.keys():
            # an MTP layer stored as ``mtp.layers.{i}`` (Qwen3-Next) is the model's decoder layer count + i, when built
            named = mtp_alias(key, count) if self.built_mtp_layers else key
            target, pattern = rename_source_key(named, renamings, converters, prefix, own)
            if target not in own and key in own:
                target, pattern = rename_source_key(key, [], [], prefix, own)
            if target in own:
                sources[target].append(key)
                self.targets[key] = (target, pattern)
                converter = self._converters.get(pattern)
                for other in converter.target_patterns[1:] if converter is not None else ():  # a split (qkv)
                    split = target.replace(converter.target_patterns[0], other)
                    if split in own:
                        sources[split].append(key)
            else:
                self.unmatched.append(key)
                self.renamed[key] = target
        return dict(sources)

    def concatenated_fused(self, key: str) -> bool:
        """True when checkpoint ``key`` is one of several whole fused tensors that transformers concatenates along a
        later dimension into its model tensor (`concatenates_fused`): pruned by its own dimension 0."""
        pattern = self.targets.get(key, (None, None))[1]
        return pattern is not None and concatenates_fused(self._converters.get(pattern))

    def stored_dim(self, key: str, dim: int, shape: tuple[int, ...]) -> int | None:
        """The dimension of checkpoint ``key`` that becomes dimension ``dim`` of its model tensor (of ``shape``) under
        a transposing conversion (`transposed_dim`), when the stored shape is the model's transposed; else
        None."""
        pattern = self.targets.get(key, (None, None))[1]
        converter = self._converters.get(pattern) if pattern is not None else None
        found = transposed_dim(converter, dim) if converter is not None else None
        if found is None:
            return None
        ops = converter.operations[0]
        stored = list(shape)
        stored[ops.dim0], stored[ops.dim1] = shape[ops.dim1], shape[ops.dim0]
        return found if tuple(self.checkpoint.shape(key)) == tuple(stored) else None

    def merged_pieces(self, name: str) -> dict[str, dict[int, str]] | None:
        """{source pattern: {expert: checkpoint key}} of a model tensor that transformers' standard per-expert merge
        builds (`standard_merge`), None for one read as it is or through another conversion."""
        keys = self.sources[name]
        patterns = [self.targets[key][1] for key in keys]
        converter = self._converters.get(patterns[0]) if patterns[0] is not None else None
        if converter is None or not standard_merge(converter):
            return None
        by_pattern: dict[str, dict[int, str]] = {p: {} for p in converter.source_patterns}
        for key, pattern in zip(keys, patterns, strict=True):
            match = EXPERT_INDEX.search(key)
            if pattern not in by_pattern or match is None:
                return None
            by_pattern[pattern][int(match.group(1))] = key
        return by_pattern

    # ------------------------------------------------------------------ load / release
    def load(self, modules: Iterable[str]) -> None:
        """Read the tensors of ``modules`` (names in ``model``) from the checkpoint into the model."""
        modules = list(modules)
        self._load(self._wanted(modules), modules)

    def _load(self, wanted: list[str], modules: list[str]) -> None:
        """Read the model tensors ``wanted`` (state-dict names) in; ``modules``: what was asked for, for errors."""
        tied = self._tied(wanted)
        wanted += [s for s in tied.values() if s not in wanted and self._get(s).device.type == "meta"]
        missing = sorted(name for name in wanted if name not in tied and name not in self.sources)
        if missing:
            raise ValueError(f"checkpoint {str(self.checkpoint.path)!r} has no tensor for {missing[:8]}"
                             f"{f' and {len(missing) - 8} more' if len(missing) > 8 else ''} of module(s) "
                             f"{modules}: it would load with random weights")
        converted = []
        ahead, self._ahead = (self._ahead.take(wanted) if self._ahead is not None else {}), None
        # largest first: each takes the smallest released storage that holds it (:meth:`ReadPool.take`)
        for name in sorted(wanted, key=lambda n: -self._get(n).nbytes):
            if name in tied:
                continue
            tensor = ahead[name] if name in ahead else self._read(name, self._get(name))
            if tensor is None:
                converted.append(name)
                continue
            self._set(name, self.copies.to_device(tensor))
        if self.pool is not None:
            self.pool.drop()  # what this load did not take
        if converted:
            self._convert(modules, converted)
        self.copies.finish()  # the model's next kernels wait for the copies, the host does not
        for target, source in tied.items():
            self._set(target, self._get(source))

    def _read(self, name: str, like: torch.Tensor) -> torch.Tensor | None:
        """The model tensor ``name`` read from its checkpoint keys: a renamed tensor as it is, or the per-expert
        tensors of transformers' standard merge (``MergeModulelist(dim=0)``, then ``Concatenate(dim=1)`` of
        several source patterns) written straight into the fused tensor, one expert slice at a time (no stacked
        copies); None for any other conversion (`_convert` runs transformers' own)."""
        keys = self.sources[name]
        patterns = [self.targets[key][1] for key in keys]
        if patterns == [None]:
            stored = self.checkpoint.dtype(keys[0]), tuple(self.checkpoint.shape(keys[0]))
            if stored == (like.dtype, tuple(like.shape)):
                tensor = self._buffer(like.shape, like.dtype)
                self.checkpoint.read_into(keys[0], tensor)
            else:
                tensor = self.checkpoint.tensor(keys[0], dtype=like.dtype)
            return self._checked(name, tensor, like)
        by_pattern = self.merged_pieces(name)
        if by_pattern is None:
            return None
        out = self._buffer(like.shape, like.dtype)
        offset = 0
        for found in by_pattern.values():
            rows = self.checkpoint.shape(found[0])
            if len(rows) != out.dim() - 1 or tuple(rows[1:]) != tuple(out.shape[2:]) or \
                    offset + rows[0] > out.shape[1]:
                raise ValueError(f"checkpoint {str(self.checkpoint.path)!r}: {found[0]} {list(rows)} does not fit "
                                 f"{name} {list(out.shape)}")
            for expert, key in found.items():
                part = out[expert, offset:offset + rows[0]]
                if self.checkpoint.dtype(key) == out.dtype:
                    self.checkpoint.read_into(key, part)
                else:
                    part.copy_(self.checkpoint.tensor(key))
            offset += rows[0]
        return self._checked(name, out, like, covered=offset)

    def _checked(self, name: str, tensor: torch.Tensor, like: torch.Tensor, covered: int | None = None) -> torch.Tensor:
        if tuple(tensor.shape) != tuple(like.shape) or (covered is not None and covered != like.shape[1]):
            raise ValueError(f"checkpoint {str(self.checkpoint.path)!r}: {name} is {list(tensor.shape)} on disk, "
                             f"the model's is {list(like.shape)}")
        return tensor

    def _convert(self, modules: list[str], names: list[str]) -> None:
        """Load ``names`` through transformers' own conversion (for the conversions `_read` does not do)."""
        from transformers.core_model_loading import convert_and_load_state_dict_in_model
        from transformers.modeling_utils import LoadStateDictConfig

        keys = sorted({key for name in names for key in self.sources[name]})
        state = {key: self.checkpoint.tensor(key) for key in keys}
        config = LoadStateDictConfig(weight_mapping=self._mapping, dtype=self.dtype, device_map={"": self.device})
        with quiet_progress():
            info, _ = convert_and_load_state_dict_in_model(self.model, state, config)
        problems = []
        left = sorted(set(info.missing_keys) & set(names))
        if left:
            problems.append(f"left unloaded: {left[:8]}")
        if info.mismatched_keys:
            problems.append(f"of another shape than the model's: {sorted(info.mismatched_keys)[:8]}")
        if info.unexpected_keys:
            problems.append(f"not in the model: {sorted(info.unexpected_keys)[:8]}")
        if info.conversion_errors:
            problems.append(f"not convertible: {info.conversion_errors}")
        if info.error_msgs:
            problems.append("; ".join(info.error_msgs))
        if problems:
            raise ValueError(f"checkpoint {str(self.checkpoint.path)!r}, module(s) {modules}: tensors "
                             + "; ".join(problems))

    def release(self, modules: Iterable[str]) -> None:
        """Put the tensors of ``modules`` back on the meta device (non-persistent buffers stay). With a ``pool``,
        the released tensors that nothing else holds go to it (the next [`load`][] of this skeleton or of one
        sharing the pool reads into them); the rest of the freed memory goes back to the system (`_trim`)."""
        self._release(self._wanted(list(modules)))

    def _release(self, names: list[str]) -> None:
        freed = False
        for name in names:
            tensor = self._get(name)
            if tensor.device.type != "meta":
                if self.pool is not None:
                    self.pool.give(tensor, references=2)  # the module's and ``tensor``
                self._set(name, torch.empty(tensor.shape, dtype=tensor.dtype, device="meta"))
                freed = True
        if freed and self.device.type == "cpu":
            trim_freed_memory()

    def _buffer(self, shape: Iterable[int], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor of ``shape`` and ``dtype`` to read into: from the pool, or new."""
        return self.pool.take(shape, dtype) if self.pool is not None else self.copies.host_buffer(tuple(shape), dtype)

    def prefetch(self, modules: Iterable[str]) -> None:
        """Have the checkpoint bytes of ``modules`` read into the page cache in the background
        ([`Checkpoint.will_need`][]): called for the next layer while this one computes, its [`load`][] then
        copies from memory instead of waiting on the disk. With `read_ahead` (a GPU) a thread also reads them
        into host memory now (`ReadAhead`), taken by the next
        [`load`][]."""
        wanted = self._wanted(list(modules))
        tied = self._tied(wanted)
        self.checkpoint.will_need(sorted({key for name in wanted if name not in tied
                                          for key in self.sources.get(name, ())}))
        if self.read_ahead and self.pool is None:
            if self._ahead is not None:
                self._ahead.wait()  # an earlier read ahead no load took: dropped
            names = sorted((name for name in wanted if name not in tied and name in self.sources),
                           key=lambda n: -self._get(n).nbytes)
            self._ahead = ReadAhead(names, lambda name: self._read(name, self._get(name)))

    @contextlib.contextmanager
    def resident(self, *modules: str) -> Iterator[nn.Module]:
        """``with skeleton.resident("model.layers.3"):`` the module's tensors are in memory inside the block."""
        self.load(modules)
        try:
            yield self.model
        finally:
            self.release(modules)

    @contextlib.contextmanager
    def resident_tensors(self, *names: str) -> Iterator[nn.Module]:
        """``with skeleton.resident_tensors("model.layers.3.mlp.gate.weight"):`` those model tensors (state-dict names)
        are in memory inside the block, the rest of their modules as it was; names of non-persistent buffers (always in
        memory) are skipped."""
        unknown = [name for name in names if name not in self._names and not self._non_persistent(name)]
        if unknown:
            raise ValueError(f"{unknown[:8]} are not tensors of {type(self.model).__name__}")
        wanted = [name for name in dict.fromkeys(names) if name in self._names]
        self._load(wanted, list(wanted))  # ``wanted`` gains the tied sources it reads: released with it
        try:
            yield self.model
        finally:
            self._release(wanted)

    def _non_persistent(self, name: str) -> bool:
        owner, _, attr = name.rpartition(".")
        try:
            module = self.model.get_submodule(owner)
        except AttributeError:
            return False
        return attr in module._non_persistent_buffers_set

    def is_resident(self, module: str) -> bool:
        return all(self._get(name).device.type != "meta" for name in self._wanted([module]))

    # ------------------------------------------------------------------ internals
    def _wanted(self, modules: list[str]) -> list[str]:
        for module in modules:
            if module:
                self.model.get_submodule(module)  # AttributeError naming it when there is no such module
        heads = tuple(f"{m}." if m else "" for m in modules)
        return [name for name in self._names if name.startswith(heads)]

    def _tied(self, names: list[str]) -> dict[str, str]:
        """{tied tensor: its source} among ``names`` (``lm_head.weight`` of a tied embedding)."""
        ties: dict[str, Any] = getattr(self.model, "all_tied_weights_keys", None) or {}
        return {target: source for target, source in ties.items() if target in names}

    def _get(self, name: str) -> torch.Tensor:
        owner, _, attr = name.rpartition(".")
        module = self.model.get_submodule(owner)
        return module._parameters[attr] if attr in module._parameters else module._buffers[attr]

    def _set(self, name: str, tensor: torch.Tensor) -> None:
        owner, _, attr = name.rpartition(".")
        module = self.model.get_submodule(owner)
        if attr in module._parameters:
            module._parameters[attr] = tensor if isinstance(tensor, nn.Parameter) else \
                nn.Parameter(tensor, requires_grad=False)
        else:
            module._buffers[attr] = tensor

"""The text testbed: a small Qwen3-MoE-style causal LM trained here, on CPU, deterministically.

No pretrained weights can be fetched, so criteria are compared on a model we train ourselves (issue "Evidence"; a first
probe, on 2 CPU cores, measured that a balanced model needs about 25 minutes at hidden 256 before criteria leave
random's spread). The corpus is `lightprune.testbed.text_corpus` (prose and code from the standard library) with
its local BPE tokenizer; the model is ``qwen3_moe`` from a config with transformers' own initialisation, trained with
AdamW, linear warm-up and cosine decay, next-token loss on every token plus each MoE layer's load-balancing loss
(``router_aux_loss_coef``, ``aux_loss``), for a fixed number of steps (not a time budget, so a rerun gives the same
weights on the same machine and thread count).

Presets (`TEXT_TESTBEDS`): ``micro`` (tests; seconds), ``small`` (the README's default job;
about two minutes the first time), ``full`` (the quality tables; about 17 minutes alone on 2 cores).

`text_testbed` returns the checkpoint folder, training it first when no valid one is cached:
``<root>/testbed/text-<preset>-<digest>/`` with ``model/`` (``save_pretrained`` weights, config and
tokenizer: a checkpoint every lightprune command loads), ``training.json`` (the spec, the loss curve,
held-out perplexity per domain, seconds) and a manifest; written under a temporary name and renamed
into place like every lightprune cache. ``root`` is the given folder, ``$LIGHTPRUNE_CACHE`` or
``~/.cache/lightprune``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from lightprune.data import TextJsonlDataModule
from lightprune.data.cache import write_manifest
from lightprune.data.default_corpus import default_model_overrides
from lightprune.data.rows import read_jsonl
from lightprune.testbed.text_corpus import TextCorpus, TextCorpusSpec, build_text_corpus, rows_by_domain
from lightprune.testbed.training import (
    cache_root,
    cached_testbed,
    encode_batches,
    facts_digest,
    fit_from_init,
    next_token_metrics,
    spec_digest,
    training_facts,
)
from lightprune.testing.tiny import tiny_config

__all__ = ["TEXT_TESTBEDS", "TESTBED_PREFIX", "TextTestbedSpec", "held_out_perplexity", "resolve_testbed", "spec_with",
           "corpus_datamodule", "instruction_datamodule", "preset_of", "text_testbed"]

TEXT_TESTBED_FORMAT = "v1"
TESTBED_PREFIX = "testbed:"


@dataclass(frozen=True)
class TextTestbedSpec:
    """Everything the trained weights depend on (its digest names the cache folder)."""

    corpus: TextCorpusSpec = TextCorpusSpec()
    model: dict[str, Any] = field(default_factory=dict)  # qwen3_moe config overrides (vocab comes from the tokenizer)
    steps: int = 1000
    batch_size: int = 16
    max_length: int = 256
    learning_rate: float = 2e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01
    # the load-balancing loss of each MoE layer on its own (lightprune.finetune.balance): transformers' pooled one
    # (at 0.01) left 3-8 of 16 experts under 1% of a layer's routing; per layer at 0.05 the normalised routing
    # entropy is 0.95-0.99 on the small preset
    router_aux_loss_coef: float = 0.05
    aux_loss: str = "per_layer"
    seed: int = 0
    eval_batches: int | None = None  # held-out batches per domain for the reported perplexity (None: all)

    def digest(self) -> str:
        return spec_digest(TEXT_TESTBED_FORMAT, self)


_FULL_MODEL = dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                   intermediate_size=512, moe_intermediate_size=256, num_experts=16, num_experts_per_tok=2,
                   norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False)

TEXT_TESTBEDS: dict[str, TextTestbedSpec] = {
    "micro": TextTestbedSpec(
        corpus=TextCorpusSpec(max_chars=20_000, chunk_chars=400, vocab_size=512),
        model=dict(_FULL_MODEL, num_hidden_layers=2, hidden_size=32, head_dim=8, intermediate_size=32,
                   moe_intermediate_size=16, num_experts=8),
        steps=30, batch_size=8, max_length=64, learning_rate=5e-3, warmup_steps=3, eval_batches=2),
    "small": TextTestbedSpec(
        corpus=TextCorpusSpec(max_chars=1_000_000, vocab_size=2048),
        model=dict(_FULL_MODEL, hidden_size=128, head_dim=32, intermediate_size=256, moe_intermediate_size=128),
        steps=1200, batch_size=8, max_length=128, learning_rate=3e-3, warmup_steps=20, eval_batches=16),
    # at 0.05 the last layer's normalised routing entropy was 0.943 (the goal is 0.95)
    "full": TextTestbedSpec(model=dict(_FULL_MODEL), router_aux_loss_coef=0.1),
}


def preset_of(name: str) -> str:
    """The preset of a testbed checkpoint name ``"testbed:text-<preset>"``; a ValueError naming the choices."""
    kind, _, preset = name[len(TESTBED_PREFIX):].partition("-") if name.startswith(TESTBED_PREFIX) else ("", "", "")
    if kind != "text" or preset not in TEXT_TESTBEDS:
        raise ValueError(f"unknown testbed {name!r}; choose one of "
                         f"{[f'{TESTBED_PREFIX}text-{p}' for p in TEXT_TESTBEDS]}")
    return preset


def resolve_testbed(name: str, root: str | os.PathLike | None = None) -> Path:
    """``"testbed:text-<preset>"`` -> the trained checkpoint's folder (trained first when not cached)."""
    return text_testbed(preset_of(name), root) / "model"


def _folder(preset: str, spec: TextTestbedSpec, root) -> Path:
    return cache_root(root) / "testbed" / f"text-{preset}-{spec.digest()}-{facts_digest()}"


def text_testbed(preset: str | TextTestbedSpec = "small", root: str | os.PathLike | None = None, *,
                 progress: bool = True) -> Path:
    """The folder of the trained testbed ``preset`` (or a spec), trained and cached when absent or corrupt."""
    if isinstance(preset, TextTestbedSpec):
        spec, name = preset, "custom"
    elif preset in TEXT_TESTBEDS:
        spec, name = TEXT_TESTBEDS[preset], preset
    else:
        raise ValueError(f"unknown text testbed preset {preset!r}; choose one of {list(TEXT_TESTBEDS)}")
    expect = {"format": TEXT_TESTBED_FORMAT, "digest": spec.digest(), "facts": training_facts()}
    return cached_testbed(_folder(name, spec, root), expect,
                          lambda tmp: _train(tmp, spec, build_text_corpus(spec.corpus, root), expect, progress))


def corpus_datamodule(spec: TextTestbedSpec, corpus: TextCorpus, **overrides: Any):
    """The corpus's splits as a TextJsonlDataModule with the spec's batching (loss on every token)."""
    kw = dict(max_length=spec.max_length, batch_size=spec.batch_size, mask_prompt=False, add_eos=True, seed=spec.seed)
    return TextJsonlDataModule(**corpus.jsonl_args(), **{**kw, **overrides})


def instruction_datamodule(spec: TextTestbedSpec, corpus: TextCorpus, folder: str | os.PathLike, **overrides: Any):
    """Instruction data for the testbed, distinct in form from its pretraining text: the question / answer rows on
    Python's documentation topics of Testbed VQA's text task (its train pool,
    `text_pool`), written to ``folder/instructions.jsonl`` as
    prompt / completion rows (loss on the answer only), served with the corpus's tokenizer and the spec's
    batching as the datamodule's train split. The content comes from the same documentation as the corpus."""
    from lightprune.data.generated.testbed_vqa import text_pool

    path = Path(folder) / "instructions.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": q + "\n", "completion": a}) + "\n" for q, a, _ in text_pool("train")))
    kw = dict(max_length=spec.max_length, batch_size=spec.batch_size, mask_prompt=True, add_eos=True, seed=spec.seed)
    return TextJsonlDataModule(tokenizer=str(corpus.tokenizer_dir), train=str(path), **{**kw, **overrides})


def _initial_checkpoint(folder: Path, spec: TextTestbedSpec, tokenizer) -> Path:
    """transformers' own initialisation of the spec's config, saved (what MoECausalLM loads)."""
    import torch
    from transformers import AutoModelForCausalLM


    config = tiny_config("qwen3_moe", **{**spec.model, **default_model_overrides(tokenizer),
                                         "max_position_embeddings": spec.max_length,
                                         "router_aux_loss_coef": spec.router_aux_loss_coef})
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    path = folder / "init"
    model.save_pretrained(str(path))
    return path


def held_out_perplexity(model, corpus: TextCorpus, spec: TextTestbedSpec, split: str = "test",
                        max_batches: int | None = None) -> dict[str, float]:
    """exp(mean next-token loss) over ``split``'s rows per domain and overall (every token, eos included)."""
    dm = corpus_datamodule(spec, corpus)
    by_domain = {**rows_by_domain(corpus.files[split]), "all": read_jsonl(corpus.files[split])}
    return {domain: next_token_metrics(model, encode_batches(dm, rows, max_batches))[0]
            for domain, rows in by_domain.items()}


def _train(folder: Path, spec: TextTestbedSpec, corpus: TextCorpus, expect: dict[str, Any], progress: bool) -> None:
    dm = corpus_datamodule(spec, corpus)
    init = _initial_checkpoint(folder, spec, dm.tokenizer)
    model, seconds, curve = fit_from_init(folder, init, dm, spec, router_aux_loss_coef=spec.router_aux_loss_coef,
                                          progress=progress)
    ppl = {split: held_out_perplexity(model, corpus, spec, split, spec.eval_batches) for split in ("val", "test")}
    out = folder / "model"
    model.save_pretrained(str(out))
    dm.tokenizer.save_pretrained(str(out))
    write_manifest(out, expect)
    params = sum(p.numel() for p in model.parameters())
    record = {"spec": asdict(spec), "corpus": str(corpus.root), "parameters": params, "train_seconds": seconds,
              "tokens_per_second": spec.steps * spec.batch_size * spec.max_length / seconds,
              "held_out_perplexity": ppl, "loss_curve": curve}
    (folder / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    write_manifest(folder, expect)


def spec_with(preset: str, **changes: Any) -> TextTestbedSpec:
    """A preset with some fields changed (e.g. ``steps``), for experiments."""
    return replace(TEXT_TESTBEDS[preset], **changes)

"""Save, load and verify pruned checkpoints.

::

    result = lp.export_pruned(model, plan, out_dir)   # mask -> reference logits, prune, save, verify
    result = lp.export_pruned(model, merge, out_dir)  # a MergePlan: merged into the dominants' slots, then as above
    lp.save_pruned(model, out_dir)                    # an already pruned model
    model = lp.load_pruned(out_dir)                   # never runs the checkpoint's code
    lp.save_width_pruned(model, width_plan, out_dir)  # MWOP: weights + width_plan.json, kernels on load
    lp.prune_checkpoint(src_dir, plan, out_dir)      # a checkpoint directory, shard by shard ([`streamed`][.streamed])
    lp.quantize_checkpoint(src_dir, out_dir)          # then FP8 block-scaled, as DeepSeek-V3 ships
    ([`quantize`][.quantize])
    convert_to_gguf(out_dir, "model.gguf")            # a uniform export through llama.cpp's converter (`gguf`)

Checkpoints are safetensors only, written to a hidden sibling directory and renamed into place
after verification. A checkpoint whose layers keep different numbers of experts records them as
``config.lightprune_experts_per_layer`` and carries a ``modeling_lightprune.py`` (torch and
transformers only) so that ``AutoModel...from_pretrained(path, trust_remote_code=True)`` loads
it without lightprune.

Each export returns its result ([`result`][.result]): [`ExportResult`][] (``save_pruned``, ``export_pruned``,
``prune_checkpoint``) or [`WidthExportResult`][] (``save_width_pruned``), the figures of the manifest it wrote
(`MANIFEST_FILE`) as attributes, and ``os.PathLike``: the checkpoint path.

May import: models, checkpoints, experts, width and core; never finetune, callbacks or above.
"""

from lightprune.checkpoints.directory import TOKENIZER_FILES
from lightprune.export.card_facts import CARD_KEYS
from lightprune.export.gguf import GGUFResult, convert_to_gguf
from lightprune.export.load import check_checkpoint, load_pruned
from lightprune.export.model_card import CARD_FILE, model_card
from lightprune.export.pipeline import export_pruned
from lightprune.export.quantize import quantize_checkpoint
from lightprune.export.result import MANIFEST_FILE, ExportResult, WidthExportResult
from lightprune.export.save import save_pruned
from lightprune.export.streamed import prune_checkpoint
from lightprune.export.verify import ExportVerificationError, default_probe
from lightprune.export.width import save_width_pruned
from lightprune.export.width_format import WIDTH_PLAN_FILE, attach_width_kernels

__all__ = ["save_pruned", "load_pruned", "export_pruned", "prune_checkpoint", "ExportVerificationError",
           "default_probe", "check_checkpoint", "quantize_checkpoint", "MANIFEST_FILE", "save_width_pruned",
           "attach_width_kernels", "WIDTH_PLAN_FILE",
           "model_card", "CARD_FILE", "CARD_KEYS", "TOKENIZER_FILES", "ExportResult", "WidthExportResult",
           "convert_to_gguf", "GGUFResult"]

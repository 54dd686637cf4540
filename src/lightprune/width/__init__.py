"""MWOP whole: width pruning of MLLMs, attention paths per head and FFN channels per modality (MWOP ("MWOP:
Modality-aware Width-wise Operation Pruning for Efficient MLLMs")).

Built bottom-up, each module importing only those before it:

- `paths` (a leaf: modality codes, the three paths V2V / T2V / T2T and their pair masks);
- `layers` (the language decoder's heads and FFN channels), `modality` (each token's
  modality), `plan` ([`WidthPlan`][]), `flops` (decoder FLOPs, appendix D.4);
- `kernels` (span / FlexAttention / masked-SDPA / Triton path-sparse attention and the cost model that
  chooses among them, the compact FFN), `attention_choice` (the export's choice per layer and device type);
- `attention` (the attention implementation that masks or gates paths), `mask`
  ([`mask_width`][], reversible), `swap` (compact FFNs swapped in);
- `taylor` (first-order Taylor importance), `min_rank` (per-category rankings combined, the
  "All Tasks" calibration), `select` (scores -> plan), `retention` (task accuracy and ATR),
  `search` (the staged search's decisions, Algorithm 1);
- `scorer` ([`WidthScorer`][], the interface every width importance implements) and `scorers`
  (one registry, [`register_width_scorer`][] / [`get_width_scorer`][], with the built-ins ``taylor``,
  ``min_rank`` and ``random``).

May import: models, observe and the shared leaves; never experts, finetune, export, callbacks or above.
"""

from __future__ import annotations

from lightprune.width.flops import decoder_flops
from lightprune.width.layers import WidthLayer, find_width_layers
from lightprune.width.mask import mask_width
from lightprune.width.min_rank import min_rank_scores
from lightprune.width.modality import token_modality, token_profile
from lightprune.width.plan import WidthPlan
from lightprune.width.scorer import WidthScorer, category_batches
from lightprune.width.scorers import available_width_scorers, get_width_scorer, register_width_scorer
from lightprune.width.select import random_scores, select_channels, select_paths
from lightprune.width.taylor import WidthScores, taylor_importance

__all__ = ["WidthLayer", "WidthPlan", "WidthScorer", "WidthScores", "available_width_scorers", "category_batches",
           "decoder_flops", "find_width_layers", "get_width_scorer", "mask_width", "min_rank_scores", "random_scores",
           "register_width_scorer", "select_channels", "select_paths", "taylor_importance", "token_modality",
           "token_profile"]

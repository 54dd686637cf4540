"""Out-of-core: checkpoints read tensor by tensor, models whose modules are loaded one at a time.

- :class:`Checkpoint`: a safetensors directory, headers read once, tensors on demand;
- :class:`Skeleton`: the checkpoint's model on the meta device, modules made resident and released;
- :func:`score_weights`: ``lp.score_weights`` for a model or a checkpoint directory;
- :func:`prune_checkpoint`: a checkpoint pruned shard by shard, verified layer by layer;
- :func:`layer_by_layer`, :func:`run_layer_outer`: a skeleton's model run with one decoder layer in memory;
- :func:`collect_expert_stats`: ``lp.collect_expert_stats`` for a model or a checkpoint directory.

May import: models, observe, experts, export and the shared leaves; never finetune, callbacks or above.
"""

from lightprune.stream.calibrate import collect_checkpoint_stats, collect_expert_stats
from lightprune.stream.checkpoint import Checkpoint
from lightprune.stream.prune import prune_checkpoint
from lightprune.stream.scores import score_checkpoint, score_weights
from lightprune.stream.sequential import layer_by_layer, run_layer_outer
from lightprune.stream.skeleton import Skeleton, checkpoint_dtype

__all__ = ["Checkpoint", "Skeleton", "checkpoint_dtype", "collect_checkpoint_stats", "collect_expert_stats",
           "layer_by_layer", "prune_checkpoint", "run_layer_outer", "score_checkpoint", "score_weights"]

"""``deepspeed.checkpointing``: activation checkpointing with DeepSpeed's API.

    from launcher.zero import checkpointing
    checkpointing.configure(None, deepspeed_config="ds.json")   # or keyword flags
    y = checkpointing.checkpoint(block, x)                      # recomputed in backward
    checkpointing.checkpoint_blocks(model)                      # every block, in one call

Built in ``launcher/zero/activations/recompute.py``.
"""
from launcher.zero.activations.recompute import (  # noqa: F401
    CheckpointingOptions, checkpoint, checkpoint_blocks, chunked_loss, configure, current_options, find_blocks,
    is_configured, options_from_config, profile_stats, reset, uncheckpoint_blocks,
)

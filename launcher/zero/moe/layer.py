"""``deepspeed.moe.layer``: ``MoE`` raises ``NotSupportedError`` when built."""
from launcher.zero.moe import not_built


class MoE:
    """DeepSpeed's Mixture-of-Experts layer; not built in this engine yet."""

    def __init__(self, *args, **kwargs):
        raise not_built("deepspeed.moe.layer.MoE")

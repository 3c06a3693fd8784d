"""``deepspeed.runtime.zero.tiling``: ``TiledLinear`` and ``TiledLinearReturnBias``.

Built in ``launcher/zero/stages/stage3/tiled_linear.py``.
"""
from launcher.zero.stages.stage3.tiled_linear import TiledLinear, TiledLinearReturnBias  # noqa: F401

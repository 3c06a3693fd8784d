"""``deepspeed.ops.lamb``: ``FusedLamb`` is this engine's Lamb (FusedLamb's formula and defaults)."""
from launcher.zero.optim.lamb import Lamb as FusedLamb  # noqa: F401

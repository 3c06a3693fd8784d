"""1-bit Adam: Adam with 1-bit compressed momentum averaging after a warm-up (DeepSpeed 0.16.5).

`OnebitAdam` is the optimizer (config type "OneBitAdam" / "OnebitAdam"); it averages the
gradients itself (`handles_gradient_communication = True`), so the engine must not.
"""

from launcher.zero.optim.onebit.optimizer import OnebitAdam
from launcher.zero.optim.onebit.counted_collectives import CommCounter

OneBitAdam = OnebitAdam

__all__ = ["OnebitAdam", "OneBitAdam", "CommCounter"]

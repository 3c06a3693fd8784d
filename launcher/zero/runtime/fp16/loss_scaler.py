"""``deepspeed.runtime.fp16.loss_scaler``: DeepSpeed's scaler classes over this engine's scaling rule.

Built in ``launcher/zero/precision/deepspeed_scalers.py``.
"""
from launcher.zero.config.deepspeed_helpers import DeepSpeedConfigObject  # noqa: F401
from launcher.zero.precision.deepspeed_scalers import (  # noqa: F401
    CONSECUTIVE_HYSTERESIS, DELAYED_SHIFT, INITIAL_LOSS_SCALE, MIN_LOSS_SCALE, SCALE_WINDOW, CreateLossScaler,
    DynamicLossScaler, LossScaler, LossScalerBase, to_python_float,
)

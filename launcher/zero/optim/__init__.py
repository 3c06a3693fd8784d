"""Optimizers by config name (DeepSpeed's names, case-insensitive; then any torch.optim class)."""
from launcher.zero.optim.factory import (  # noqa: F401
    ZERO_TESTED_OPTIMIZERS, build_optimizer, check_master_dtype_support, check_zero_support)
from launcher.zero.optim.lamb import Lamb, lamb_coefficient  # noqa: F401

"""Optimizers by config name (DeepSpeed's names, case-insensitive; then any torch.optim class)."""
from launcher.zero.optim.factory import ZERO_TESTED_OPTIMIZERS, build_optimizer, check_zero_support  # noqa: F401
from launcher.zero.optim.lamb import Lamb, lamb_coefficient  # noqa: F401

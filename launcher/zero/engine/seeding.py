"""``set_random_seed``: seed Python's, NumPy's and torch's generators (``deepspeed.runtime.utils``)."""
from __future__ import annotations

import random


def set_random_seed(seed: int) -> None:
    """Seed Python's, NumPy's (when installed) and torch's generators, as DeepSpeed does."""
    import torch

    random.seed(seed)
    try:
        import numpy
    except ImportError:
        pass
    else:
        numpy.random.seed(seed)
    torch.manual_seed(seed)

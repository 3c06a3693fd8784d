"""The engine's logger (``dslaunch.zero``, to stdout) and ``log_dist``, DeepSpeed's per-rank log call."""
from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger("dslaunch.zero")
if not logger.handlers:
    _handler = logging.StreamHandler(sys.stdout)
    _handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d] %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def log_dist(message: str, ranks=None, level: int = logging.INFO) -> None:
    """Log ``message`` on the given ranks (None: every rank; [-1]: every rank too)."""
    rank = int(os.environ.get("RANK", 0))
    if ranks is None or -1 in ranks or rank in ranks:
        logger.log(level, f"[Rank {rank}] {message}")

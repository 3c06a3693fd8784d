"""``deepspeed.add_config_arguments``: the ``--deepspeed`` and ``--deepspeed_config`` flags.

``zero.initialize(args=...)`` reads ``args.deepspeed_config`` (or the older
``args.deepscale_config``) when no ``config=`` is given. Torch-free.
"""
from __future__ import annotations

import argparse


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add DeepSpeed's config flags to ``parser`` and return it (DeepSpeed's spelling and defaults)."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="Enable DeepSpeed (kept for scripts; the engine is always on)")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file.")
    group.add_argument("--deepscale", default=False, action="store_true", help=argparse.SUPPRESS)
    group.add_argument("--deepscale_config", default=None, type=str, help=argparse.SUPPRESS)
    return parser

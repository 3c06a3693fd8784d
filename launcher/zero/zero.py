"""``deepspeed.zero``: what scripts reach as ``deepspeed.zero.<name>``.

``register_external_parameter`` is accepted and does nothing: at stage 3 this engine gathers a
partitioned parameter whenever a module reads it during forward, which is what the DeepSpeed
call exists to arrange by hand.
"""
from __future__ import annotations

from launcher.zero.init_context import GatheredParameters, Init  # noqa: F401


def register_external_parameter(module, parameter) -> None:
    """No-op (see the module docstring)."""


def unregister_external_parameter(module, parameter) -> None:
    """No-op (see the module docstring)."""

"""Runners: each renders a plan into commands (pure) and launches it."""
from __future__ import annotations

from launcher.runners.base import ControlEndpoint, get_runner

__all__ = ["ControlEndpoint", "get_runner"]

"""Runners: each renders a plan into the commands that start its nodes (pure; control/launch.py runs them)."""
from __future__ import annotations

from launcher.control.runners.base import get_runner
from launcher.wire import ControlEndpoint

__all__ = ["ControlEndpoint", "get_runner"]

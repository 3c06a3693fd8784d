"""Run a DeepSpeed script unchanged: ``import deepspeed`` gets this engine (``dslaunch --as-deepspeed``).

``python -m launcher.zero.shim SCRIPT ARGS...`` (what dslaunch puts on each rank's command line)
puts the ``deepspeed`` package next to this file first on ``sys.path`` and on ``PYTHONPATH``
(so that worker processes the script spawns see it too), then runs SCRIPT as ``__main__``.
That package makes ``deepspeed`` *be* ``launcher.zero`` and installs ``AliasFinder``, which
answers ``import deepspeed.X`` with the very module object ``launcher.zero.X``: one module, one
set of classes, whichever name a script uses.

A real DeepSpeed installed on the node would be hidden by this; the shim refuses to start then.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys

SHIM_DIR = os.path.dirname(os.path.abspath(__file__))   # holds the 'deepspeed' package
ALIAS, TARGET = "deepspeed", "launcher.zero"


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return None   # a throwaway module; exec_module swaps in the real one

    def exec_module(self, module) -> None:
        # importlib returns whatever sys.modules holds under the name after exec_module
        sys.modules[module.__name__] = importlib.import_module(self.target)


class AliasFinder(importlib.abc.MetaPathFinder):
    """``deepspeed.X.Y`` -> the module ``launcher.zero.X.Y`` itself."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(ALIAS + "."):
            return None
        real = TARGET + fullname[len(ALIAS):]
        if importlib.util.find_spec(real) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real))


def install() -> None:
    """Make ``deepspeed`` and every ``deepspeed.X`` resolve to this engine in this process."""
    if not any(isinstance(finder, AliasFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, AliasFinder())
    sys.modules[ALIAS] = importlib.import_module(TARGET)


def real_deepspeed(search_path: list[str]) -> str | None:
    """Where a real DeepSpeed would be imported from on ``search_path`` (None: not installed)."""
    spec = importlib.machinery.PathFinder.find_spec(ALIAS, [p for p in search_path if os.path.abspath(p or ".") != SHIM_DIR])
    return None if spec is None else (spec.origin or str(list(spec.submodule_search_locations or [])))

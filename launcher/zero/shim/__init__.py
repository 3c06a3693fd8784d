"""Run a DeepSpeed script unchanged: ``import deepspeed`` gets this engine (``dslaunch --as-deepspeed``).

``python -m launcher.zero.shim SCRIPT ARGS...`` (what dslaunch puts on each rank's command line)
puts the ``deepspeed`` package next to this file first on ``sys.path`` and on ``PYTHONPATH``
(so that worker processes the script spawns see it too), then runs SCRIPT as ``__main__``.
That package makes ``deepspeed`` *be* ``launcher.zero`` and installs ``AliasFinder``, which
answers ``import deepspeed.X`` for exactly the paths of ``paths.DEEPSPEED_PATHS``: with the very
module object named there (one module, one set of classes, whichever name a script uses), or with
a stub whose names raise ``NotSupportedError``. Any other ``deepspeed.X`` is not found.

The same finder answers ``importlib.metadata`` for the ``deepspeed`` distribution (version
``DEEPSPEED_VERSION``), so integrations that check the package before they import it (accelerate's
and transformers' ``is_deepspeed_available()``, ``dep_version_check``) see DeepSpeed exactly while
the shim is installed in the process -- nothing is installed on disk that could shadow a real one.

A real DeepSpeed installed on the node would be hidden by this; the shim refuses to start then.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import pathlib
import re
import sys
import types

from launcher.zero.errors import NotSupportedError
from launcher.zero.shim.paths import DEEPSPEED_PATHS, DEEPSPEED_VERSION, NotBuilt

SHIM_DIR = os.path.dirname(os.path.abspath(__file__))   # holds the 'deepspeed' package
ALIAS = "deepspeed"


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str | NotBuilt):
        self.target = target

    def create_module(self, spec):
        if isinstance(self.target, NotBuilt):
            return _not_built_module(spec.name, self.target)
        return None   # a throwaway module; exec_module swaps in the real one

    def exec_module(self, module) -> None:
        if isinstance(self.target, NotBuilt):
            return
        # importlib returns whatever sys.modules holds under the name after exec_module
        sys.modules[module.__name__] = importlib.import_module(self.target)


def _not_built_module(name: str, missing: NotBuilt) -> types.ModuleType:
    """A package whose listed submodules import and whose every other name raises NotSupportedError."""
    module = types.ModuleType(name, f"{name}: not built in dslaunch's engine ({missing.feature}).")
    module.__path__ = []

    def __getattr__(attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(f"module '{name}' has no attribute '{attribute}'")
        if f"{name}.{attribute}" in DEEPSPEED_PATHS:
            return importlib.import_module(f"{name}.{attribute}")
        raise NotSupportedError(f"{name}.{attribute}: {missing.feature} is not supported by dslaunch's engine yet",
                                hint=missing.hint)

    module.__getattr__ = __getattr__
    return module


class ShimDistribution(importlib.metadata.Distribution):
    """The ``deepspeed`` distribution as ``importlib.metadata`` sees it under the shim: a name and a version."""

    METADATA = (f"Metadata-Version: 2.1\nName: {ALIAS}\nVersion: {DEEPSPEED_VERSION}\n"
                "Summary: dslaunch's ZeRO engine answering for DeepSpeed (dslaunch --as-deepspeed)\n")

    def read_text(self, filename):
        return self.METADATA if filename in ("METADATA", "PKG-INFO") else None

    def locate_file(self, path):
        return pathlib.Path(SHIM_DIR) / path


class AliasFinder(importlib.metadata.DistributionFinder):
    """``deepspeed.X.Y`` -> what ``DEEPSPEED_PATHS`` names for it; a path not listed is not found.

    Also the finder of the ``deepspeed`` distribution's metadata (``ShimDistribution``).
    """

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        name = context.name
        if name is None or re.sub(r"[-_.]+", "-", name).lower() == ALIAS:
            yield ShimDistribution()

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(ALIAS + "."):
            return None
        if fullname not in DEEPSPEED_PATHS:
            # stop here: the path finders would otherwise find our internals under deepspeed.__path__
            raise ModuleNotFoundError(f"No module named '{fullname}' (dslaunch's DeepSpeed shim answers the paths "
                                      "listed in launcher/zero/shim/paths.py)", name=fullname)
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(DEEPSPEED_PATHS[fullname]))


def install() -> None:
    """Make ``deepspeed`` and every ``deepspeed.X`` resolve to this engine in this process."""
    if not any(isinstance(finder, AliasFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, AliasFinder())
    sys.modules[ALIAS] = importlib.import_module(DEEPSPEED_PATHS[ALIAS])


def real_deepspeed(search_path: list[str]) -> str | None:
    """Where a real DeepSpeed would be imported from on ``search_path`` (None: not installed)."""
    spec = importlib.machinery.PathFinder.find_spec(ALIAS, [p for p in search_path if os.path.abspath(p or ".") != SHIM_DIR])
    return None if spec is None else (spec.origin or str(list(spec.submodule_search_locations or [])))

"""A submodule by its dotted name (``"model.layers.0.mlp"``): read it or replace it (LoRA-style surgery)."""
from __future__ import annotations

from typing import Any


def recursive_getattr(model: Any, module_name: str) -> Any:
    """``model.a.b.c`` for ``module_name`` ``"a.b.c"``."""
    value = model
    for name in module_name.split("."):
        value = getattr(value, name)
    return value


def recursive_setattr(model: Any, module_name: str, module: Any) -> None:
    """Set ``model.a.b.c = module`` for ``module_name`` ``"a.b.c"`` (a new submodule registers as usual)."""
    *parents, last = module_name.split(".")
    setattr(recursive_getattr(model, ".".join(parents)) if parents else model, last, module)

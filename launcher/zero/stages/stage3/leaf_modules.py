"""ZeRO-3 leaf modules (``deepspeed.utils.set_z3_leaf_modules`` and its family).

A leaf module is gathered as one unit at stage 3: all the partitioned parameters of its subtree
before its forward, released after it, and no hooks inside it. A mixture-of-experts block whose
experts run only where tokens reach them needs this: otherwise each rank gathers the experts it
happens to run, and the ranks' all-gathers no longer pair up. Flag the modules before
``initialize`` (the engine reads the flags when it installs its hooks). The flag is DeepSpeed's
attribute, ``module._z3_leaf``, so code that tests for it reads the same answer.
"""
from __future__ import annotations

from typing import Iterable

import torch


def z3_leaf_module(module: torch.nn.Module) -> bool:
    """Whether ``module`` is flagged as a leaf."""
    return bool(getattr(module, "_z3_leaf", False))


def z3_leaf_parameter(param: torch.nn.Parameter) -> bool:
    """Whether ``param`` belongs to a leaf module the stage-3 engine gathers as a unit."""
    return hasattr(param, "ds_z3_leaf_module")


def get_z3_leaf_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of ``model`` flagged as leaves, in ``model.modules()`` order."""
    return [module for module in model.modules() if z3_leaf_module(module)]


def set_z3_leaf_module(module: torch.nn.Module, flag: bool) -> None:
    module._z3_leaf = flag


def _matches(module: torch.nn.Module, kind) -> bool:
    if isinstance(kind, type):
        return isinstance(module, kind)
    cls = type(module)
    return kind in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}")


def _flag_classes(model, leaf_module_classes: Iterable, flag: bool, raise_if_not_found: bool):
    kinds = list(leaf_module_classes)
    if not all(isinstance(kind, (type, str)) for kind in kinds):
        # DeepSpeed asserts this; a user's mistake, so the same exception type
        raise AssertionError(f"leaf_module_classes must be a list of types or names, got {kinds}")
    flagged = []
    for module in model.modules():
        if any(_matches(module, kind) for kind in kinds):
            module._z3_leaf = flag
            flagged.append(module)
    if not flagged and raise_if_not_found:
        raise ValueError(f"No modules of type {kinds} found in model {model}")
    return flagged


def set_z3_leaf_modules(model: torch.nn.Module, leaf_module_classes, raise_if_not_found: bool = True):
    """Flag every module of ``model`` whose class is one of ``leaf_module_classes`` (types, class
    names or fully qualified names) as a leaf; returns them."""
    return _flag_classes(model, leaf_module_classes, True, raise_if_not_found)


def unset_z3_leaf_modules(model: torch.nn.Module, leaf_module_classes, raise_if_not_found: bool = True):
    """Clear the leaf flag of the modules ``set_z3_leaf_modules`` would flag; returns them."""
    return _flag_classes(model, leaf_module_classes, False, raise_if_not_found)


def _flag_named(model, names, flag: bool, raise_if_not_found: bool, matches):
    flagged, missing, seen = [], [], set()
    named = list(model.named_modules())
    for wanted in names:
        hits = [module for name, module in named if matches(name, wanted)]
        if not hits:
            missing.append(wanted)
        for module in hits:
            module._z3_leaf = flag
            if id(module) not in seen:
                seen.add(id(module))
                flagged.append(module)
    if missing and raise_if_not_found:
        raise ValueError(f"No modules named {missing} found in model {model}")
    return flagged, missing


def set_z3_leaf_modules_by_name(model, module_names, flag: bool = True, raise_if_not_found: bool = True):
    """Flag the modules named (as ``named_modules()`` names them); returns (flagged, missing names)."""
    return _flag_named(model, module_names, flag, raise_if_not_found, lambda name, wanted: name == wanted)


def set_z3_leaf_modules_by_suffix(model, module_name_suffixes, flag: bool = True, raise_if_not_found: bool = True):
    """Flag the modules whose names end with one of the suffixes; returns (flagged, missing suffixes)."""
    return _flag_named(model, module_name_suffixes, flag, raise_if_not_found, lambda name, wanted: name.endswith(wanted))

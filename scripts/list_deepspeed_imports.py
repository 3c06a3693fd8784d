#!/usr/bin/env python3
"""List every ``deepspeed.X`` name that integrations and scripts import, for the shim's import sweep.

Reads Python files (installed transformers/accelerate, a DeepSpeedExamples checkout, ...) and collects
what they take from DeepSpeed: ``import deepspeed.a.b``, ``from deepspeed.a import b``, and attribute
chains on a name bound to DeepSpeed (``deepspeed.zero.Init``, ``dist.get_rank`` after
``from deepspeed import comm as dist``). Each is checked against a real DeepSpeed in this
interpreter; names it does not have (a local variable that happens to be called ``deepspeed``,
say) are left out and printed. Writes tests/data/deepspeed_imports.txt, one name a line:

    deepspeed.runtime.engine                          import the module
    deepspeed.utils:groups                            from deepspeed.utils import groups
    deepspeed:zero.GatheredParameters                 from deepspeed import zero; then .GatheredParameters

Run with the real DeepSpeed's Python, from the repository root:
    /work/dsref/bin/python scripts/list_deepspeed_imports.py SITE/transformers SITE/accelerate \
        DeepSpeedExamples/training ...
"""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import os
import sys
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "deepspeed_imports.txt"
# Named in issue 30 as broken under --as-deepspeed, whether or not a scanned file uses them.
ISSUE_NAMES = [
    "deepspeed:__version__", "deepspeed:DeepSpeedEngine", "deepspeed.runtime.engine",
    "deepspeed.runtime.engine:DeepSpeedEngine", "deepspeed.runtime.zero", "deepspeed.runtime.zero.partition_parameters",
    "deepspeed.runtime.zero:GatheredParameters", "deepspeed.runtime.zero.partition_parameters:ZeroParamStatus",
    "deepspeed.runtime.pipe", "deepspeed.runtime.pipe:PipelineModule", "deepspeed.runtime.pipe:LayerSpec",
    "deepspeed.runtime.activation_checkpointing.checkpointing", "deepspeed.utils.zero_to_fp32",
    "deepspeed.utils.zero_to_fp32:get_fp32_state_dict_from_zero_checkpoint",
    "deepspeed.utils.zero_to_fp32:convert_zero_checkpoint_to_fp32_state_dict",
    "deepspeed.utils.zero_to_fp32:load_state_dict_from_zero_checkpoint", "deepspeed.utils:safe_get_full_fp32_param",
    "deepspeed.utils:safe_get_full_grad", "deepspeed.utils:safe_get_full_optimizer_state",
    "deepspeed.utils:safe_set_full_fp32_param", "deepspeed:init_inference", "deepspeed.ops.op_builder",
    "deepspeed.checkpoint.utils", "deepspeed.checkpoint.utils:clone_tensors_for_torch_save", "deepspeed.moe",
    "deepspeed.moe.utils", "deepspeed.moe.layer:MoE",
]


def names_in(tree: ast.AST) -> list[tuple[str, int]]:
    """(name, line) for each DeepSpeed name the module uses, in the notation above."""
    bound: dict[str, str] = {}       # local name -> the entry it stands for
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "deepspeed" or alias.name.startswith("deepspeed."):
                    found.append((alias.name, node.lineno))
                    bound[alias.asname or "deepspeed"] = alias.name if alias.asname else "deepspeed"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                (node.module == "deepspeed" or node.module.startswith("deepspeed.")):
            for alias in node.names:
                if alias.name != "*":
                    found.append((f"{node.module}:{alias.name}", node.lineno))
                    bound[alias.asname or alias.name] = f"{node.module}:{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "_parent_attr", None), ast.Attribute):
            chain = attribute_chain(node)
            if chain and chain[0] in bound:
                base, rest = bound[chain[0]], chain[1:]
                found.append((f"{base}:{'.'.join(rest)}" if ":" not in base else f"{base}.{'.'.join(rest)}", node.lineno))
    return found


def attribute_chain(node: ast.Attribute) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def mark_parents(tree: ast.AST) -> None:
    """Only the longest chain counts: ``a.b.c`` is one use, not also ``a.b``."""
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            if isinstance(node, ast.Attribute) and child is node.value:
                child._parent_attr = node


def _sweep_worker():
    """The import sweep's worker module, whose ``resolve`` this list must agree with (one copy of it)."""
    path = Path(__file__).resolve().parents[1] / "tests" / "dist" / "workers" / "import_sweep_worker.py"
    spec = importlib.util.spec_from_file_location("import_sweep_worker", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


resolve = _sweep_worker().resolve   # raises what the real DeepSpeed raises for an entry


def canonical(entry: str) -> str:
    """``deepspeed:runtime.zero`` (an attribute chain through modules) -> ``deepspeed.runtime.zero``."""
    module_name, _, attributes = entry.partition(":")
    parts = attributes.split(".") if attributes else []
    while parts:
        candidate = f"{module_name}.{parts[0]}"
        try:
            if importlib.util.find_spec(candidate) is None:
                break
        except (ImportError, ValueError):
            break
        module_name, parts = candidate, parts[1:]
        if parts and not hasattr(importlib.import_module(module_name), parts[0]):
            break
    return module_name + (":" + ".".join(parts) if parts else "")


def trim(entry: str) -> str:
    """``deepspeed.utils:logger.info`` -> ``deepspeed.utils:logger``: past an object, a method is not a name."""
    module_name, _, attributes = entry.partition(":")
    if "." not in attributes:
        return entry
    first = attributes.split(".")[0]
    value = resolve(f"{module_name}:{first}")
    return entry if inspect.isclass(value) or inspect.ismodule(value) else f"{module_name}:{first}"


def scan(roots: list[Path], strip: dict[Path, str]) -> dict[str, list[str]]:
    seen: dict[str, list[str]] = defaultdict(list)
    for root in roots:
        files = [root] if root.is_file() else sorted(root.rglob("*.py"))
        for path in files:
            if "/tests/" in str(path) or "/test_utils/" in str(path):
                continue
            try:
                tree = ast.parse(path.read_text(errors="replace"))
            except SyntaxError:
                continue
            mark_parents(tree)
            for name, line in names_in(tree):
                seen[name].append(f"{strip_prefix(path, strip)}:{line}")
    return seen


def strip_prefix(path: Path, strip: dict[Path, str]) -> str:
    for prefix, label in strip.items():
        if str(path).startswith(str(prefix)):
            return label + str(path)[len(str(prefix)):]
    return str(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="+", help="files or folders; LABEL=PATH shows PATH as LABEL")
    parser.add_argument("--out", default=str(OUT))
    options = parser.parse_args()
    strip, roots = {}, []
    for item in options.roots:
        label, _, path = item.rpartition("=")
        roots.append(Path(path))
        if label:
            strip[Path(path)] = label

    import deepspeed
    seen = scan(roots, strip)
    for name in ISSUE_NAMES:
        seen[name].append("issue 30")
    entries: dict[str, list[str]] = defaultdict(list)
    dropped = []
    for name, places in seen.items():
        try:
            entry = trim(canonical(name))
            resolve(entry)
        except Exception as error:  # what the real DeepSpeed does not have is not ours to provide
            dropped.append(f"{name} ({type(error).__name__}: {str(error)[:80]}) at {places[0]}")
            continue
        entries[entry] += places
    lines = [f"# Every deepspeed name that integrations and training scripts import, checked against DeepSpeed "
             f"{deepspeed.__version__}.",
             "# Written by scripts/list_deepspeed_imports.py; read by tests/dist/test_deepspeed_import_sweep.py.",
             "# `module` is imported; `module:name.attr` is `from module import name`, then .attr.",
             "# After the name: where it was seen (the first three places, and how many more)."]
    for entry in sorted(entries):
        places = sorted(set(entries[entry]))
        more = f" (+{len(places) - 3} more)" if len(places) > 3 else ""
        lines.append(f"{entry:<72} # {', '.join(places[:3])}{more}")
    Path(options.out).write_text("\n".join(lines) + "\n")
    print(f"{len(entries)} names written to {options.out}; {len(dropped)} left out (not in the real DeepSpeed):")
    for line in sorted(dropped):
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

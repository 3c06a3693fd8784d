"""The tree's layering rules (issue 12), checked on the source: what may import what.

- nothing outside launcher/zero imports torch at module level (``dslaunch --help`` stays instant);
- launcher/zero imports nothing of the launcher but its error types;
- planning/ is pure: no subprocess, socket, paramiko or threading;
- runners only render: they never import the engine or the controller;
- node code never imports control code (nothing imports upward).
"""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "launcher"


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE.parent).with_suffix("").as_posix().replace("/", "."), path


def imports(path: Path, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def violations(rule) -> list[str]:
    return sorted(f"{name} imports {target}" for name, path in modules() for target in rule(name, path))


def under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


RULES = {
    "torch only in the engine": lambda name, path: [] if under(name, "launcher.zero") else
        [t for t in imports(path, top_level_only=True) if under(t, "torch")],
    "the engine imports only the launcher's errors": lambda name, path: [] if not under(name, "launcher.zero") else
        [t for t in imports(path) if under(t, "launcher") and not under(t, "launcher.zero")
         and not under(t, "launcher.errors")],
    "planning is pure": lambda name, path: [] if not under(name, "launcher.planning") else
        [t for t in imports(path) if t.split(".")[0] in ("subprocess", "socket", "paramiko", "threading")],
    "runners only render": lambda name, path: [] if not under(name, "launcher.control.runners") else
        [t for t in imports(path) if under(t, "launcher.zero") or under(t, "launcher.control.controller")
         or under(t, "launcher.control.launch")],
    "node code never imports control code": lambda name, path: [] if not under(name, "launcher.node") else
        [t for t in imports(path) if under(t, "launcher.control") or under(t, "launcher.app")],
    "planning imports no side": lambda name, path: [] if not under(name, "launcher.planning") else
        [t for t in imports(path) if under(t, "launcher.control") or under(t, "launcher.node")],
}


@pytest.mark.parametrize("rule", list(RULES))
def test_layering(rule):
    assert violations(RULES[rule]) == []


def test_no_source_file_over_500_lines():
    long = [(name, n) for name, path in modules() if (n := len(path.read_text().splitlines())) > 500]
    assert long == []


def test_no_function_over_60_lines():
    long = []
    for name, path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long.append(f"{name}.{node.name}")
    assert long == []

"""The launcher's import graph at a git revision: its cycles (arrows that point back up).

    python scripts/import_graph.py [REV]        # default: the work tree's HEAD

Reads every ``launcher/**/*.py`` at REV with ``git show`` (nothing is imported), collects each
module's imports of ``launcher.*`` (module level and inside functions alike), and prints the
number of modules, of import edges, and every strongly connected component larger than one
module: a cycle means some module imports a module that (directly or not) imports it back.
It does the same for folders (every module of a sub-package counted as its package; a module
directly under ``launcher/`` as itself), which is where an arrow back up shows: the controller
importing the runners package while runners import the controller is a folder cycle.
"""
from __future__ import annotations

import ast
import subprocess
import sys


def sources(rev: str) -> dict[str, str]:
    names = subprocess.check_output(["git", "ls-tree", "-r", "--name-only", rev, "launcher"], text=True).split()
    files = [n for n in names if n.endswith(".py")]
    return {f: subprocess.check_output(["git", "show", f"{rev}:{f}"], text=True) for f in files}


def module_name(path: str) -> str:
    parts = path[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: str, text: str, known: set[str]) -> set[str]:
    package = module_name(path) if path.endswith("__init__.py") else module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in known}
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main(argv: list[str]) -> int:
    rev = argv[0] if argv else "HEAD"
    files = sources(rev)
    known = {module_name(f) for f in files}
    graph = {module_name(f): imports(f, text, known) - {module_name(f)} for f, text in files.items()}
    # a package's __init__ re-exporting its children is not an arrow back up
    graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}
    report(f"{rev} modules", graph)
    packages = {module_name(f) for f in files if f.endswith("__init__.py")}
    unit = {m: (m if m in packages or m.count(".") == 1 else m.rpartition(".")[0]) for m in graph}
    folders: dict[str, set[str]] = {}
    for m, targets in graph.items():
        folders.setdefault(unit[m], set()).update(unit[t] for t in targets if unit[t] != unit[m])
    launcher_side = {u: {t for t in ts if not t.startswith("launcher.zero")}
                     for u, ts in folders.items() if not u.startswith("launcher.zero")}
    report(f"{rev} folders (launcher side)", launcher_side)
    engine_side = {u: {t for t in ts if t.startswith("launcher.zero")} for u, ts in folders.items()
                   if u.startswith("launcher.zero")}
    report(f"{rev} folders (engine)", engine_side)
    return 0


def report(label: str, graph: dict[str, set[str]]) -> None:
    found = cycles(graph)
    print(f"{label}: {len(graph)} nodes, {sum(len(t) for t in graph.values())} import edges, {len(found)} cycle(s)")
    for component in found:
        print("  cycle: " + " <-> ".join(component))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

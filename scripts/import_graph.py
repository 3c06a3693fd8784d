"""The launcher's import graph at a git revision: its cycles (arrows that point back up).

    python scripts/import_graph.py [REV] [--edges] [--local]     # REV default: HEAD
    python scripts/import_graph.py --worktree [--edges] [--local]  # the files on disk

Reads every ``launcher/**/*.py`` at REV with ``git show`` (nothing is imported), collects each
module's imports of ``launcher.*`` (module level and inside functions alike), and prints the
number of modules, of import edges, and every strongly connected component larger than one
module: a cycle means some module imports a module that (directly or not) imports it back.
It does the same for folders (every module of a sub-package counted as its package; a module
directly under ``launcher/`` or ``launcher/zero/`` as itself), which is where an arrow back up
shows: the controller importing the runners package while runners import the controller is a
folder cycle.

``--edges`` also lists the engine's folder-to-folder imports, each with the modules that make
it; an edge inside a folder cycle is marked ``round``. ``--local`` lists the imports of
``launcher.*`` inside functions in ``launcher/zero/`` and counts them.
"""
from __future__ import annotations

import argparse
import ast
import pathlib
import subprocess
import sys

ENGINE = "launcher.zero"


def worktree_sources(root: pathlib.Path) -> dict[str, str]:
    """Every ``launcher/**/*.py`` as it is on disk under ``root`` (uncommitted changes too)."""
    return {path.relative_to(root).as_posix(): path.read_text() for path in sorted((root / "launcher").rglob("*.py"))}


def sources(rev: str) -> dict[str, str]:
    names = subprocess.check_output(["git", "ls-tree", "-r", "--name-only", rev, "launcher"], text=True,
                                    stderr=subprocess.PIPE).split()
    files = [n for n in names if n.endswith(".py")]
    return {f: subprocess.check_output(["git", "show", f"{rev}:{f}"], text=True) for f in files}


def module_name(path: str) -> str:
    parts = path[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_nodes(path: str, text: str):
    """(import node, the modules it names, whether it sits inside a function) for every import."""
    package = module_name(path) if path.endswith("__init__.py") else module_name(path).rpartition(".")[0]
    tree = ast.parse(text)
    local = {id(node) for function in ast.walk(tree) if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
             for node in ast.walk(function) if isinstance(node, (ast.Import, ast.ImportFrom))}
    for node in ast.walk(tree):
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
        yield node, targets, id(node) in local


def imports(path: str, text: str, known: set[str]) -> set[str]:
    return {t for _, targets, _ in import_nodes(path, text) for t in targets if t in known}


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


def folder_of(module: str, packages: set[str]) -> str:
    """A package is its own folder; a module directly under ``launcher`` or ``launcher.zero`` is
    itself; any other module counts as its package."""
    if module in packages or module.rpartition(".")[0] in ("launcher", ENGINE):
        return module
    return module.rpartition(".")[0]


def module_graph(files: dict[str, str]) -> dict[str, set[str]]:
    known = {module_name(f) for f in files}
    graph = {module_name(f): imports(f, text, known) - {module_name(f)} for f, text in files.items()}
    # a package's __init__ re-exporting its children is not an arrow back up
    return {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}


def folder_edges(files: dict[str, str]) -> dict[tuple[str, str], set[str]]:
    """(folder, folder) -> the ``module -> module`` imports that make the edge."""
    packages = {module_name(f) for f in files if f.endswith("__init__.py")}
    edges: dict[tuple[str, str], set[str]] = {}
    for m, targets in module_graph(files).items():
        for t in targets:
            a, b = folder_of(m, packages), folder_of(t, packages)
            if a != b:
                edges.setdefault((a, b), set()).add(f"{m} -> {t}")
    return edges


def local_imports(files: dict[str, str]) -> list[tuple[str, int, str]]:
    """(file, line, modules) for every import of ``launcher.*`` inside a function under launcher/zero."""
    known = {module_name(f) for f in files}
    found = []
    for path, text in sorted(files.items()):
        if not path.startswith("launcher/zero/"):
            continue
        for node, targets, inside in import_nodes(path, text):
            named = sorted({t for t in targets if t in known})
            if inside and named:
                found.append((path, node.lineno, ", ".join(named)))
    return sorted(found, key=lambda item: (item[0], item[1]))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="import_graph.py", description=__doc__.splitlines()[0])
    parser.add_argument("rev", nargs="?", default="HEAD", help="the git revision to read (default: HEAD)")
    parser.add_argument("--edges", action="store_true", help="list the engine's folder-to-folder imports")
    parser.add_argument("--worktree", action="store_true", help="read the files on disk instead of a revision")
    parser.add_argument("--local", action="store_true", help="list the imports inside functions in launcher/zero")
    options = parser.parse_args(argv)
    if options.worktree:
        options.rev = "worktree"
    try:
        files = worktree_sources(pathlib.Path(__file__).resolve().parents[1]) if options.worktree else sources(options.rev)
    except (subprocess.CalledProcessError, OSError) as error:
        detail = (getattr(error, "stderr", None) or str(error)).strip().splitlines()
        print(f"import_graph.py: cannot read revision {options.rev!r}: {detail[0] if detail else error}",
              file=sys.stderr)
        return 2
    if not files:
        print(f"import_graph.py: no launcher/**/*.py at {options.rev!r}", file=sys.stderr)
        return 2
    graph = module_graph(files)
    report(f"{options.rev} modules", graph)
    folders: dict[str, set[str]] = {}
    for (a, b) in (edges := folder_edges(files)):
        folders.setdefault(a, set()).add(b)
    for m in graph:
        folders.setdefault(folder_of(m, {module_name(f) for f in files if f.endswith("__init__.py")}), set())
    launcher_side = {u: {t for t in ts if not t.startswith(ENGINE)} for u, ts in folders.items()
                     if not u.startswith(ENGINE)}
    report(f"{options.rev} folders (launcher side)", launcher_side)
    engine_side = {u: {t for t in ts if t.startswith(ENGINE)} for u, ts in folders.items() if u.startswith(ENGINE)}
    found = report(f"{options.rev} folders (engine)", engine_side)
    if options.edges:
        print_edges(edges, found)
    if options.local:
        listed = local_imports(files)
        for path, line, named in listed:
            print(f"  local: {path}:{line} {named}")
        print(f"{options.rev} function-local imports in launcher/zero: {len(listed)} in {len({p for p, _, _ in listed})} files")
    return 0


def print_edges(edges: dict[tuple[str, str], set[str]], components: list[list[str]]) -> None:
    """One line per engine folder edge: ``round`` inside a folder cycle, ``one-way`` otherwise."""
    member = {node: i for i, component in enumerate(components) for node in component}
    for (a, b), why in sorted(edges.items()):
        if a.startswith(ENGINE) and b.startswith(ENGINE):
            mark = "round  " if a in member and member.get(a) == member.get(b) else "one-way"
            made_by = "; ".join(sorted(" -> ".join(_short(m) for m in w.split(" -> ")) for w in why))
            print(f"  {mark} {_short(a)} -> {_short(b)}: {made_by}")


def _short(name: str) -> str:
    """'launcher.zero.engine.zero_engine' -> 'engine.zero_engine'; the root stays 'launcher.zero'."""
    return name[len(ENGINE) + 1:] if name.startswith(ENGINE + ".") else name


def report(label: str, graph: dict[str, set[str]]) -> list[list[str]]:
    found = cycles(graph)
    print(f"{label}: {len(graph)} nodes, {sum(len(t) for t in graph.values())} import edges, {len(found)} cycle(s)")
    for component in found:
        print("  cycle: " + " <-> ".join(component))
    return found


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

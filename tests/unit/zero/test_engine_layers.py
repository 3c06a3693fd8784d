"""The engine's layers (issue 40): every import inside ``launcher/zero/`` points down one declared order.

A unit is a folder directly under ``launcher/zero/`` or a module at its root. ``LAYERS`` lists the
units from the top (the DeepSpeed face, then assembly) to the bottom (the errors every layer
raises); an import may name its own unit or one of a lower layer, never one of its own layer or
above. Every import counts, at module level, inside a function or under ``TYPE_CHECKING``: an
import moved into a function to dodge a cycle is still an arrow back up. ``scripts/import_graph.py``
then finds no folder cycle in the engine.
"""
import ast
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
ENGINE = REPO / "launcher" / "zero"

# top to bottom; the units of one layer do not import each other
LAYERS = (
    # the DeepSpeed face (re-exports only; tests/unit/zero/test_house.py), "" is launcher/zero/__init__.py
    ("", "accelerator", "checkpointing", "comm", "git_version_info", "moe", "ops", "pipe", "profiling", "progress", "runtime",
     "utils", "zero"),
    ("assembly",),            # initialize for both engines
    ("pipeline",),            # the pipeline engine: its schedule, stages and links, over the engine's pieces
    ("engine",),              # the data-parallel engine: the step, its observers, compile
    ("checkpoint", "flops"),  # what the engines save and load; what they count
    ("stages",),              # the strategies: ZeRO 0-3, offload, the tensor-parallel norm
    # shared pieces below the strategies
    ("experts", "optim", "activations", "sparse_attention", "parallel", "layout", "precision", "data"),
    ("distributed",),         # the process group, collectives, the accelerator
    ("config",),              # torch-free: the launcher validates configs with it
    ("sched",),               # pure lr(step) schedules
    ("shim", "failure", "stall_beat"),  # deepspeed.X's table; how an error ends a rank; the stall beat
    ("errors",),
)
LAYER_OF = {unit: depth for depth, units in enumerate(LAYERS) for unit in units}


def unit_of(module: str) -> str:
    """'launcher.zero.stages.stage3.strategy' -> 'stages'; 'launcher.zero.errors' -> 'errors'; root -> ''."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else ""


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def engine_modules():
    for path in sorted(ENGINE.rglob("*.py")):
        yield module_name(path), path


def engine_imports(name: str, path: Path) -> set[str]:
    """Every ``launcher.zero.*`` module an import statement of ``path`` names, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {target for target in found if target.startswith("launcher.zero.")}


def test_every_unit_of_the_engine_has_a_layer():
    units = {unit_of(name) for name, _ in engine_modules()}
    assert sorted(units - set(LAYER_OF)) == [], "place the new folder or root module in LAYERS"
    assert sorted(set(LAYER_OF) - units) == [], "LAYERS names a unit that is gone"


def test_every_import_in_the_engine_points_down():
    up = []
    for name, path in engine_modules():
        here = unit_of(name)
        for target in engine_imports(name, path):
            there = unit_of(target)
            if there != here and there in LAYER_OF and LAYER_OF[there] <= LAYER_OF[here]:
                up.append(f"{name} imports {target} ({here!r} is not above {there!r})")
    assert sorted(up) == []


def test_import_graph_finds_no_folder_cycle_in_the_engine():
    spec = importlib.util.spec_from_file_location("import_graph", REPO / "scripts" / "import_graph.py")
    graph = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(graph)
    files = graph.worktree_sources(REPO)
    folders: dict[str, set[str]] = {}
    for a, b in graph.folder_edges(files):
        if a.startswith("launcher.zero") and b.startswith("launcher.zero"):
            folders.setdefault(a, set()).add(b)
            folders.setdefault(b, set())
    assert graph.cycles(folders) == []

"""The engine's house (issue 29): a DeepSpeed-shaped face of re-exports over internals that never import it.

- the face (what ``deepspeed.X`` resolves to) holds re-exports only, and nothing internal imports it;
- the launcher reaches into the engine only through its torch-free config and errors;
- ``launcher/zero/``'s root holds at most 12 modules;
- the shim answers exactly the DeepSpeed paths of its table: each imports, a not-built one raises
  ``NotSupportedError`` naming the feature where one of its names is used, an internal never resolves;
- the strategy protocol (stages/base.py) declares every strategy method the engine calls;
- no two internal modules share a file name (the face keeps DeepSpeed's names, which may repeat).
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.zero.shim.paths import DEEPSPEED_PATHS, NotBuilt

REPO = Path(__file__).resolve().parents[3]
ENGINE = REPO / "launcher" / "zero"
# the DeepSpeed-shaped face: the root package and these modules/packages below it
FACE = ("accelerator", "checkpointing", "comm", "git_version_info", "moe", "ops", "pipe", "profiling", "runtime", "utils",
        "zero")
SHARED = ("errors", "shim")   # the error types every layer raises; the shim that maps deepspeed.X to the face
NOT_BUILT_STUBS = ()          # a face whose names are stubs raising NotSupportedError until the feature exists
THIN_IMPORTS = ("__future__", "importlib", "typing")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def first_part(name: str) -> str:
    """'launcher.zero.pipe.module' -> 'pipe'; 'launcher.zero' -> ''."""
    return name.split(".")[2] if name.count(".") >= 2 else ""


def is_face(name: str) -> bool:
    return name == "launcher.zero" or (name.startswith("launcher.zero.") and first_part(name) in FACE)


def is_internal(name: str) -> bool:
    return name.startswith("launcher.zero.") and first_part(name) not in FACE + SHARED


def engine_modules():
    for path in sorted(ENGINE.rglob("*.py")):
        if "shim/deepspeed" not in path.as_posix():
            yield module_name(path), path


def imported(path: Path, top_level_only: bool = False) -> set[str]:
    """Every module an import statement names (``from a import b``: ``a`` and ``a.b``)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in tree.body if top_level_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_nothing_internal_imports_the_face():
    back = [f"{name} imports {target}" for name, path in engine_modules() if is_internal(name)
            for target in imported(path) if is_face(target)]
    assert back == []


def test_the_face_holds_re_exports_only():
    """Imports of our modules, names for them, a lazy ``__getattr__``: no code of its own."""
    built = []
    for name, path in engine_modules():
        if not is_face(name) or first_part(name) in NOT_BUILT_STUBS:
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] not in ("launcher",) + THIN_IMPORTS:
                built.append(f"{name} imports {node.module}")
            elif isinstance(node, ast.Import) and any(a.name.split(".")[0] not in THIN_IMPORTS for a in node.names):
                built.append(f"{name} imports {[a.name for a in node.names]}")
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name not in ("__getattr__", "__dir__"):
                built.append(f"{name} defines {node.name}")
            elif not isinstance(node, (ast.Import, ast.ImportFrom, ast.Expr, ast.Assign, ast.AnnAssign,
                                       ast.FunctionDef)):
                built.append(f"{name} runs {type(node).__name__} at line {node.lineno}")
    assert built == []


def test_the_launcher_reaches_the_engine_only_through_its_torch_free_config_and_errors():
    allowed = ("launcher.zero.config", "launcher.zero.errors")
    reached = sorted(f"{module_name(path)} imports {target}"
                     for path in (REPO / "launcher").rglob("*.py") if ENGINE not in path.parents
                     for target in imported(path) if target.startswith("launcher.zero")
                     and not target.startswith(allowed))
    assert reached == []
    code = ("import sys, launcher.zero, launcher.zero.config.load, launcher.zero.config.checks, launcher.zero.errors,"
            " launcher.zero.shim, launcher.zero.pipe, launcher.zero.runtime, launcher.zero.ops, launcher.zero.moe\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.stdout.strip() == "[]", done.stderr


def test_no_two_internal_modules_share_a_name():
    """One meaning per module name: a reader who sees ``comm`` or ``partition`` knows which one."""
    by_name: dict[str, list[str]] = {}
    for name, path in engine_modules():
        if not is_face(name) and path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(name)
    repeated = {base: names for base, names in by_name.items() if len(names) > 1}
    assert repeated == {}


def test_the_engine_root_holds_at_most_12_modules():
    assert len(list(ENGINE.glob("*.py"))) <= 12


SWEEP = """
import importlib, sys
from launcher.zero.shim import install
from launcher.zero.shim.paths import DEEPSPEED_PATHS, NotBuilt
from launcher.zero.errors import NotSupportedError
install()
for path, target in DEEPSPEED_PATHS.items():
    module = importlib.import_module(path)
    if isinstance(target, NotBuilt):
        try:
            module.some_name
        except NotSupportedError as error:
            assert target.feature in str(error), (path, error)
        else:
            raise AssertionError(path + ": a not-built name did not raise")
    else:
        assert module is importlib.import_module(target), path
print("imported", len(DEEPSPEED_PATHS))
for internal in sys.argv[1:]:
    try:
        importlib.import_module(internal)
    except ModuleNotFoundError:
        print("not found", internal)
"""


def test_the_shim_answers_every_listed_deepspeed_path_and_no_internal():
    internals = ["deepspeed.engine", "deepspeed.config", "deepspeed.distributed", "deepspeed.stages.stage3",
                 "deepspeed.pipeline.engine", "deepspeed.errors", "deepspeed.shim", "deepspeed.runtime.zero.stage3"]
    done = subprocess.run([sys.executable, "-c", SWEEP, *internals], capture_output=True, text=True, cwd=REPO)
    assert done.stdout.splitlines() == [f"imported {len(DEEPSPEED_PATHS)}"] + [f"not found {i}" for i in internals], \
        done.stderr


@pytest.mark.parametrize("path", ["deepspeed.runtime.zero.partition_parameters",
                                  "deepspeed.runtime.activation_checkpointing.checkpointing",
                                  "deepspeed.runtime.engine", "deepspeed.runtime.pipe", "deepspeed.utils.zero_to_fp32",
                                  "deepspeed.checkpoint.utils", "deepspeed.ops.op_builder",
                                  "deepspeed.ops.sparse_attention", "deepspeed.moe.layer", "deepspeed.moe.utils",
                                  "deepspeed.moe.sharded_moe", "deepspeed.moe.experts", "deepspeed.utils.groups",
                                  "deepspeed.profiling.flops_profiler"])
def test_the_table_lists_the_paths_deepspeed_scripts_import(path):
    """Issue 30's list: each path is in the one table, mapped to a module or marked not built."""
    assert isinstance(DEEPSPEED_PATHS.get(path), (str, NotBuilt))


def strategy_calls(path: Path) -> set[str]:
    """Every ``<...>.strategy.<name>`` and ``strategy.<name>`` that a module reads."""
    tree = ast.parse(path.read_text())
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and (isinstance(node.value, ast.Attribute) and node.value.attr == "strategy"
                 or isinstance(node.value, ast.Name) and node.value.id == "strategy")}


def test_the_strategy_protocol_declares_every_method_the_engine_calls():
    from launcher.zero.stages.base import ZeroStrategy

    users = [ENGINE / "engine" / "zero_engine.py", ENGINE / "engine" / "optimizer_step.py",
             ENGINE / "engine" / "accessors.py", ENGINE / "checkpoint" / "save_load.py"]
    called = set().union(*(strategy_calls(path) for path in users))
    assert {"prepare_master_grads", "grad_square_sum", "release_gathered", "full_shapes"} <= called
    declared = set(dir(ZeroStrategy)) | set(ZeroStrategy.__annotations__)
    undeclared = sorted(called - declared)
    assert not undeclared, f"the engine calls strategy methods stages/base.py does not declare: {undeclared}"
    probes = [path.name for path in users if 'getattr(self.strategy' in path.read_text()
              or 'getattr(engine.strategy' in path.read_text()]
    assert not probes, f"optional strategy methods probed with getattr in {probes}"


def test_the_deepspeed_names_page_lists_every_path_of_the_table():
    """docs/reference/deepspeed-names.md says which DeepSpeed paths the shim answers, and with what."""
    page = (REPO / "docs" / "reference" / "deepspeed-names.md").read_text()
    missing = [path for path in DEEPSPEED_PATHS if f"`{path}`" not in page]
    assert missing == [], f"paths of launcher/zero/shim/paths.py not on the DeepSpeed names page: {missing}"
    for path, target in DEEPSPEED_PATHS.items():
        if isinstance(target, NotBuilt):
            assert target.feature in page, path
        else:
            assert f"| `{path}` | `{target}` |" in page, path

"""``python -m launcher.zero.shim [-m] SCRIPT ARGS...``: run SCRIPT with ``deepspeed`` = this engine."""
from __future__ import annotations

import os
import runpy
import sys

from launcher.zero.shim import SHIM_DIR, install, real_deepspeed

USAGE = "usage: python -m launcher.zero.shim [-m] SCRIPT [ARGS...]"


def main(argv: list[str]) -> int:
    as_module = bool(argv) and argv[0] == "-m"
    argv = argv[1:] if as_module else argv
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    found = real_deepspeed(sys.path)
    if found is not None:
        print(f"dslaunch: --as-deepspeed: a real DeepSpeed is installed here ({found}); running this script "
              "with dslaunch's engine would hide it.\n  hint: uninstall deepspeed in this environment, or change "
              "the script's imports (docs/migrating/deepspeed.md) and drop --as-deepspeed", file=sys.stderr)
        return 2
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SHIM_DIR, os.environ.get("PYTHONPATH")) if p)
    target, sys.argv = argv[0], list(argv)
    if not as_module:
        sys.path[0:0] = [os.path.dirname(os.path.abspath(target))]
    sys.path.insert(1, SHIM_DIR)
    install()
    if as_module:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(target, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

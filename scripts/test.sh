#!/usr/bin/env bash
# The test suite, from a fresh clone: a venv with CPU torch and dslaunch, then pytest
# (the cluster tests start the local test cluster when run as root with sshd/pdsh/mpirun).
#   scripts/test.sh                 everything
#   scripts/test.sh tests/unit -q   any pytest arguments
set -euo pipefail
cd "$(dirname "$0")/.."
# An active virtualenv or conda env that already has torch >= 2.4 (the README's first command
# installs it) is used as it is: no second venv, no second torch. DSLAUNCH_VENV=DIR forces a venv.
ACTIVE=${VIRTUAL_ENV:-${CONDA_PREFIX:-}}
if [ -z "${DSLAUNCH_VENV:-}" ] && [ -n "$ACTIVE" ] && [ -x "$ACTIVE/bin/python" ] && "$ACTIVE/bin/python" -c '
import sys, torch
major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
sys.exit(0 if (major, minor) >= (2, 4) else 1)' 2>/dev/null; then
    PY="$ACTIVE/bin/python"
    echo "scripts/test.sh: using the active environment $ACTIVE (torch $("$PY" -c 'import torch; print(torch.__version__)'))"
else
    VENV=${DSLAUNCH_VENV:-.venv}
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv "$VENV"
    fi
    PY="$VENV/bin/python"
    "$PY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    # torch==2.13.0 is pinned here: on this project's machines it is the CPU build on local disk;
    # a bare 'torch' would download a multi-GB CUDA build. The package itself asks for torch>=2.4.
    "$PY" -m pip install -q torch==2.13.0
fi
# the docs extra too: tests/smoke/test_docs_build.py runs `mkdocs build --strict`
"$PY" -m pip install -q -e '.[test,docs]'

# tests/cluster brings up scripts/local-cluster itself (root, sshd, pdsh, mpirun needed)
# and skips, saying why, where it cannot.
export PATH="$(dirname "$PY"):$PATH"
START=$SECONDS
trap 'echo "scripts/test.sh: the suite took $((SECONDS - START)) s"' EXIT
"$PY" -m pytest "${@:-tests}" -q -rs --durations=15

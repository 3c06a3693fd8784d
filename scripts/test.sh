#!/usr/bin/env bash
# The test suite, from a fresh clone: a venv with CPU torch and dslaunch, then pytest
# (the cluster tests start the local test cluster when run as root with sshd/pdsh/mpirun).
#   scripts/test.sh                 everything
#   scripts/test.sh tests/unit -q   any pytest arguments
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DSLAUNCH_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch==2.13.0 is pinned here: on this project's machines it is the CPU build on local disk;
# a bare 'torch' would download a multi-GB CUDA build. The package itself asks for torch>=2.4.
"$PY" -m pip install -q torch==2.13.0
"$PY" -m pip install -q -e '.[test]'

# tests/cluster brings up scripts/local-cluster itself (root, sshd, pdsh, mpirun needed)
# and skips, saying why, where it cannot.
export PATH="$PWD/$VENV/bin:$PATH"
START=$SECONDS
trap 'echo "scripts/test.sh: the suite took $((SECONDS - START)) s"' EXIT
"$PY" -m pytest "${@:-tests}" -q -rs --durations=15

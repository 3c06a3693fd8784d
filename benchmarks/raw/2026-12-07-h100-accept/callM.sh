#!/usr/bin/env bash
# session 2026-12-07 09:15 call 2: a gpu_runs.sh part ($2) on main
set -uo pipefail
out=$1; part=$2; mkdir -p $out
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site device-carry/*.whl >/dev/null 2>&1 && export PYTHONPATH=/tmp/site
tar xzf .dev/ds-ext.tgz -C /tmp && export TORCH_EXTENSIONS_DIR=/tmp/ds-ext
export ACCEPT_COMMIT=$(cat .dev/commit)
bash scripts/gpu_runs.sh $part $out/$part

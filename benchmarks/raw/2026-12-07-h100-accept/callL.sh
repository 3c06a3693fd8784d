#!/usr/bin/env bash
# session 2026-12-07 09:15 call: the acceptance run on main (gpu_runs.sh accept), then the GPU tests in what is left
set -uo pipefail
out=$1; mkdir -p $out
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site device-carry/*.whl >/dev/null 2>&1 && export PYTHONPATH=/tmp/site
tar xzf .dev/ds-ext.tgz -C /tmp && export TORCH_EXTENSIONS_DIR=/tmp/ds-ext
export ACCEPT_COMMIT=$(cat .dev/commit)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
ACCEPT_BUDGET=${ACCEPT_BUDGET:-470} bash scripts/gpu_runs.sh accept $out/acc
left=$((${CALL_S:-580} - SECONDS)); echo "== gpu tests (${left}s)"; date -u
[ $left -gt 40 ] && timeout $left python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider --durations=5 >$out/gpu-tests.txt 2>&1; tail -25 $out/gpu-tests.txt

#!/usr/bin/env bash
# session 2026-12-07 12:44 call 1: traces of one GPT step (plain, ours zero2, ours zero3 compiled), then gpu_runs.sh ratio
set -uo pipefail
out=$1; mkdir -p $out
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site device-carry/*.whl >/dev/null 2>&1 && export PYTHONPATH=/tmp/site
tar xzf .dev/ds-ext.tgz -C /tmp && export TORCH_EXTENSIONS_DIR=/tmp/ds-ext
export ACCEPT_COMMIT=$(cat .dev/commit)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for v in plain zero2 zero3_compile; do
  timeout 110 python3 scripts/trace_steps.py --variant $v --warmup 3 --steps 5 --trace-steps 1 --trace $out/tr-$v.json.gz 2>&1 | grep -v '^\[zero\]' | tail -3
  python3 scripts/trace_summary.py $out/tr-$v.json.gz --top 12 > $out/tr-$v.txt 2>&1; head -30 $out/tr-$v.txt
done
echo "== ratio at $SECONDS s"; date -u
bash scripts/gpu_runs.sh ratio $out/ratio
cd $out && tar czf traces.tar.gz tr-* && rm -f tr-*; ls -la $out $out/ratio

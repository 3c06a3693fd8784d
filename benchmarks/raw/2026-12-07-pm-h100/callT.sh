#!/usr/bin/env bash
# session 2026-12-07 12:44, the last main, in the ~200 s left: accept's Llama cells (plain and ours at stages 0-3
# and stage 2 + offload; DeepSpeed's cells taken from this morning's H100 run)
set -uo pipefail
out=$1; mkdir -p $out/acc
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 ACCEPT_COMMIT=$(cat .dev/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
raw=benchmarks/raw/2026-12-07-h100-accept
timeout 95 python3 scripts/gpu_accept.py $out/acc --budget 75 --models llama --no-trainer \
  --variants zero0,zero1,zero2,zero3,zero2_offload --deepspeed-from $raw/cells.jsonl >$out/acc/accept.txt 2>&1
echo "accept exit $? at ${SECONDS}s"
grep -v -E '^\| [a-z0-9]+ \| [a-z0-9_]+ \| plain \|' $out/acc/accept.md || tail -20 $out/acc/accept.txt
cd $out && tar czf acc.tar.gz acc; rm -rf acc

#!/usr/bin/env bash
# session 2026-12-07 12:44, the last main, in the device time refused starts left: accept's plain and ours cells
# (DeepSpeed's taken from this morning's H100 run, DeepSpeed unchanged, so DeepSpeed is not installed here)
set -uo pipefail
out=$1; budget=${2:-250}; mkdir -p $out/acc
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
export ACCEPT_COMMIT=$(cat .dev/commit)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
raw=benchmarks/raw/2026-12-07-h100-accept
timeout $((budget + 20)) python3 scripts/gpu_accept.py $out/acc --budget $budget --deepspeed-from $raw/cells.jsonl,$raw/trainer-rerun/cells.jsonl >$out/acc/accept.txt 2>&1
echo "accept exit $? at ${SECONDS}s"
grep -v -E '^\| [a-z0-9]+ \| [a-z0-9_]+ \| plain \|' $out/acc/accept.md || tail -30 $out/acc/accept.txt
cd $out && tar czf acc.tar.gz acc; rm -rf acc; ls -la

#!/usr/bin/env bash
# session 2026-12-07 20:00, call 1: accept early (DeepSpeed's cells reused), param NVMe with a 150 s window,
# the offload advice line on a GPU, the GPU tests with time; files straight to $OUT
set -uo pipefail
o=$1
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 ACCEPT_COMMIT=$(cat .dev/commit)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; echo "main $ACCEPT_COMMIT"; df -h /tmp | tail -1; free -g | head -2
raw=benchmarks/raw/2026-12-07-h100-accept
timeout 290 python3 scripts/gpu_accept.py /tmp/acc --budget 255 --deepspeed-from $raw/cells.jsonl,$raw/trainer-rerun/cells.jsonl >$o/accept.txt 2>&1
echo "accept exit $? at ${SECONDS}s"; cp /tmp/acc/accept.md /tmp/acc/cells.jsonl $o/
grep -v -E '^\| [a-z0-9]+ \| [a-z0-9_]+ \| plain \|' $o/accept.md | grep -v '^| model | plain_split\|^| [a-z0-9]* | [0-9]' | cut -c1-200
mkdir -p /tmp/logs
timeout 120 python3 scripts/bench_engine.py --warmup 2 --steps 4 --bytes --peak-size 0 --timeout 95 --log-dir /tmp/logs \
    --variants plain,zero3_offload_all,zero3_offload_all_pnvme >$o/pnvme.jsonl 2>$o/pnvme.txt; echo "pnvme exit $? at ${SECONDS}s"
grep -E '^(variant|zero|plain)' $o/pnvme.txt | cut -c1-220; grep -h 'NVMe offload' /tmp/logs/*.log | cut -c1-400 | head -2; ls -la /tmp/dslaunch-bench-nvme/*/ 2>/dev/null | head
timeout 85 python3 scripts/bench_engine.py --warmup 3 --steps 8 --peak-size 0 --timeout 40 --log-dir /tmp/logs \
    --variants plain,zero2_offload_overlap,zero2_offload_overlap_ratio30 >$o/advice.jsonl 2>$o/advice.txt; echo "advice exit $? at ${SECONDS}s"
grep -E '^(variant|zero|plain)' $o/advice.txt | cut -c1-220; grep -h 'offload: ' /tmp/logs/zero2*.log | cut -c1-600 | head -6
tar czf $o/logs.tar.gz -C /tmp logs
timeout 90 python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider >$o/gpu-tests.txt 2>&1; echo "gpu tests exit $? at ${SECONDS}s"; tail -4 $o/gpu-tests.txt

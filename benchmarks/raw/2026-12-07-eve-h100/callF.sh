#!/usr/bin/env bash
# session 2026-12-07 16:22, call F on the session's last engine change: stage 3's parameters on NVMe (issue 43 item 4) beside
# them in host memory, accept (DeepSpeed's cells reused from the morning's H100 run), then the GPU tests; files straight to $OUT
set -uo pipefail
o=$1
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 ACCEPT_COMMIT=$(cat .dev/commit)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; echo "main $ACCEPT_COMMIT"; df -h /tmp | tail -1
timeout 40 python3 scripts/bench_engine.py --warmup 2 --steps 3 --bytes --peak-size 0 --timeout 30 \
    --variants zero3_offload_all,zero3_offload_all_pnvme >$o/pnvme.jsonl 2>$o/pnvme.txt; echo "pnvme exit $? at ${SECONDS}s"
grep -v '^\[zero\]' $o/pnvme.txt | grep -v '^\[bench\]' | grep -E '^(variant|zero|\[detail)' | cut -c1-300; grep -h 'nvme' $o/pnvme.txt | grep -v '^\[bench\]' | cut -c1-300 | head -3
raw=benchmarks/raw/2026-12-07-h100-accept
timeout 290 python3 scripts/gpu_accept.py /tmp/acc --budget 258 --deepspeed-from $raw/cells.jsonl,$raw/trainer-rerun/cells.jsonl >$o/accept.txt 2>&1
echo "accept exit $? at ${SECONDS}s"; cp /tmp/acc/accept.md /tmp/acc/cells.jsonl $o/
grep -v -E '^\| [a-z0-9]+ \| [a-z0-9_]+ \| plain \|' $o/accept.md | grep -v '^| model | plain_split\|^| [a-z0-9]* | [0-9]'
timeout 78 python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider >$o/gpu-tests.txt 2>&1; echo "gpu tests exit $? at ${SECONDS}s"; tail -4 $o/gpu-tests.txt

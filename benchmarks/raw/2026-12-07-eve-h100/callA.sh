#!/usr/bin/env bash
# session 2026-12-07 16:22, call A: accept on main (DeepSpeed's cells reused from the morning's H100 run), then GPT compile
set -uo pipefail
out=$1; total=${2:-560}; mkdir -p $out/acc
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ls device-carry/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site device-carry/*.whl >/dev/null 2>&1 && export PYTHONPATH=/tmp/site
export ACCEPT_COMMIT=$(cat .dev/commit)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
raw=benchmarks/raw/2026-12-07-h100-accept
timeout 330 python3 scripts/gpu_accept.py $out/acc --budget 290 --deepspeed-from $raw/cells.jsonl,$raw/trainer-rerun/cells.jsonl >$out/acc/accept.txt 2>&1
echo "accept exit $? at ${SECONDS}s"
grep -v -E '^\| [a-z0-9]+ \| [a-z0-9_]+ \| plain \|' $out/acc/accept.md
b=(python3 scripts/bench_engine.py --warmup 3 --steps 6)
r() { local n=$1 s=$2; shift 2; left=$((total - SECONDS)); [ $left -lt 45 ] && { echo "== $n skipped (${left}s left)"; return; }
      [ $s -gt $left ] && s=$left; echo "== $n ($s s): $*"; timeout $s "$@" >$out/$n.jsonl 2>$out/$n.txt; echo "   exit $?"
      grep -v '^\[zero\]' $out/$n.txt | grep -E '^(variant|plain|zero|\[detail\])' | cut -c1-300 | tail -8; }
r gpt-compile 230 "${b[@]}" --timeout 70 --variants plain_compile,zero3_compile,zero0_compile
cd $out && tar czf acc.tar.gz acc *.txt *.jsonl 2>/dev/null; rm -rf acc *.txt *.jsonl; ls -la

#!/usr/bin/env bash
# session 2026-12-07 09:15 call 3: stage-3 compile (GPT 406M, HF Llama 1.24B) and the offload A/B (2 repeats)
set -uo pipefail
out=$1; mkdir -p $out
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site device-carry/*.whl >/dev/null 2>&1 && export PYTHONPATH=/tmp/site
tar xzf .dev/ds-ext.tgz -C /tmp && export TORCH_EXTENSIONS_DIR=/tmp/ds-ext
b=(python3 scripts/bench_engine.py)
r() { local n=$1 s=$2; shift 2; echo "== $n: $*"; timeout $s "$@" >$out/$n.jsonl 2>$out/$n.txt; echo "   exit $?"; grep -v '^\[bench\]' $out/$n.txt | grep -v '^\[zero\]' | tail -12; }
r gpt-compile3 125 "${b[@]}" --warmup 3 --steps 6 --timeout 100 --peak-size 0 --variants plain_compile,zero3_compile
r llama-compile3 135 "${b[@]}" --model llama --batch 8 --warmup 2 --steps 5 --timeout 110 --peak-size 0 --variants zero3_compile,plain
r offload-ab 215 "${b[@]}" --warmup 3 --steps 6 --repeat 2 --budget 200 --timeout 60 --variants plain,zero2_offload_overlap,zero2_offload_overlap_torch_pinned,zero3_offload_overlap,zero3_offload_overlap_torch_pinned
python3 scripts/offload_floor.py $out/offload-ab.jsonl | tee $out/offload-ab-floor.txt
left=$((545 - SECONDS)); echo "== host-buffers (${left}s)"
[ $left -gt 30 ] && timeout $left python3 scripts/bench_host_buffers.py --repeat 3 >$out/host-buffers.jsonl 2>$out/host-buffers.txt; tail -8 $out/host-buffers.jsonl
cd $out && tar czf calln.tar.gz *.txt *.jsonl && rm -f *.txt *.jsonl; ls -la

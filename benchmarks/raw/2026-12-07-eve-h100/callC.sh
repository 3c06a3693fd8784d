#!/usr/bin/env bash
# session 2026-12-07 16:22, call C (issue 43): offload_optimizer.ratio swept with overlap_step and bf16 states on the 406M GPT
# and the HF Llama 1.24B beside plain; item 1's A/B: 6d3c329's tree against this one, same card, same run
set -uo pipefail
out=$1; mkdir -p $out/c; o=$out/c
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; nproc; echo "main $(cat .dev/commit)"
r() { local n=$1 s=$2; shift 2; echo "== $n ($s s) at ${SECONDS}s: $*"; timeout $s "$@" >$o/$n.jsonl 2>$o/$n.txt; echo "   exit $?"
      grep -v '^\[zero\]' $o/$n.txt | grep -v '^\[bench\]' | grep -E '^(variant|plain|zero|\[median)' | cut -c1-200 | tail -14
      grep -h 'offload: over' $o/$n.txt | cut -c1-400 | head -8; }
b=(python3 scripts/bench_engine.py --warmup 3 --steps 8 --peak-size 0 --bytes)
r gpt 150 "${b[@]}" --timeout 40 --variants plain,zero2_offload_overlap_ratio30,zero2_offload_overlap_ratio40,zero3_offload_overlap_ratio30,zero3_offload_overlap_ratio40,zero2_offload_overlap_bf16states_ratio50,zero3_offload_overlap_bf16states_ratio50
r llama 150 "${b[@]}" --model llama --batch 8 --timeout 50 --variants plain,zero2_offload_overlap_ratio10,zero2_offload_overlap_ratio20,zero2_offload_overlap_bf16states_ratio25,zero3_offload_overlap_ratio20
r ab-main 50 python3 scripts/bench_engine.py --warmup 3 --steps 8 --timeout 40 --variants plain,zero2_offload_overlap
(cd .dev/old && echo "== ab-6d3c329 at ${SECONDS}s" && timeout 50 python3 scripts/bench_engine.py --warmup 3 --steps 8 --timeout 40 --variants plain,zero2_offload_overlap >$o/ab-old.jsonl 2>$o/ab-old.txt; echo "   exit $?"; grep -v '^\[zero\]' $o/ab-old.txt | grep -E '^(variant|plain|zero)' | tail -4)
echo "done at ${SECONDS}s"
cd $out && tar czf c.tar.gz c && rm -rf c; ls -la

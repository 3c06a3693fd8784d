#!/usr/bin/env bash
# session 2026-12-07 16:22, call B on cc6b0a5: the Llama's compile ratios at stages 0-3 (issue 39), then gpu_runs.sh ratio2 (issue 43)
set -uo pipefail
out=$1; mkdir -p $out/r2
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
echo "== llama-compile"
timeout 300 python3 scripts/bench_engine.py --model llama --batch 8 --warmup 2 --steps 5 --timeout 70 --peak-size 0 \
   --variants plain_compile,zero0_compile,zero1_compile,zero2_compile,zero3_compile >$out/llama-compile.jsonl 2>$out/llama-compile.txt
echo "   exit $?"; grep -v '^\[zero\]' $out/llama-compile.txt | grep -E '^(variant|plain|zero|\[detail\])' | cut -c1-330 | tail -12
bash scripts/gpu_runs.sh ratio2 $out/r2
cd $out && tar czf b.tar.gz r2 *.txt *.jsonl; rm -rf r2 *.txt *.jsonl; ls -la

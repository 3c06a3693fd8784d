#!/usr/bin/env bash
# planned 2026-12-07 20:00 (not run: no device machine was lent), call 2 (issue 43): DeepSpeed 0.19.8's own
# offload_optimizer.ratio at stage 3 beside ours, on the 406M GPT and the HF Llama 1.24B, plain in the same process
# list (~400 s); with a second argument `ab`, item 1's A/B instead: 6d3c329's tree against this one, 3 interleaved
# repeats (~300 s). Needs device-carry/
# (scripts/build_device_carry.sh) and .dev/old (git archive 6d3c329 | tar x -C .dev/old) in carry.
# Run from the repository root: cp benchmarks/raw/2026-12-07-night/call2.sh .dev/ && bash .dev/call2.sh $OUT [ab]
set -uo pipefail
o=$1 what=${2:-ratio}
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site device-carry/*.whl >/dev/null 2>&1 \
    || { echo "no device-carry/"; exit 3; }
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; nproc
python3 -c "import deepspeed; print('deepspeed', deepspeed.__version__)"
r() { local n=$1 s=$2; shift 2; echo "== $n ($s s) at ${SECONDS}s"; timeout $s "$@" >$o/$n.jsonl 2>$o/$n.txt; echo "   exit $?"
      grep -v '^\[zero\]' $o/$n.txt | grep -v '^\[bench\]' | grep -E '^(variant|plain|zero|ds_)' | cut -c1-200 | tail -14; }
b=(python3 scripts/bench_engine.py --warmup 3 --steps 8 --peak-size 0 --bytes)
if [ "$what" = ratio ]; then
# DeepSpeed JIT-builds its CPU Adam on the first offload variant (about a minute on 16 cores): ds_zero3_offload first
r gpt 230 "${b[@]}" --timeout 120 --variants plain,ds_zero3_offload,ds_zero3_offload_ratio30,zero3_offload_overlap_ratio30,ds_zero3_offload_bf16states_ratio50,zero3_offload_overlap_bf16states_ratio50
r llama 150 "${b[@]}" --model llama --batch 8 --timeout 60 --variants plain,ds_zero3_offload_ratio20,zero3_offload_overlap_ratio20
fi
[ "$what" = ab ] && for i in 1 2 3; do
  r ab-main-$i 50 python3 scripts/bench_engine.py --warmup 3 --steps 8 --peak-size 0 --timeout 40 --variants plain,zero2_offload_overlap
  (cd .dev/old && timeout 50 python3 scripts/bench_engine.py --warmup 3 --steps 8 --timeout 40 --variants plain,zero2_offload_overlap \
      >$o/ab-old-$i.jsonl 2>$o/ab-old-$i.txt; echo "== ab-old-$i exit $?"; grep -E '^(plain|zero)' $o/ab-old-$i.txt | tail -2)
done
echo "done at ${SECONDS}s"; cd $o && ls ab-* >/dev/null 2>&1 && tar czf ab.tar.gz ab-* && rm -f ab-*; ls -la

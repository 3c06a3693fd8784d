#!/usr/bin/env bash
# The GPU measurements of benchmarks/RESULTS.md, in parts that each fit one device call
# (10 minutes): run from the repository root on the GPU machine, with the DeepSpeed wheel and its
# dependencies carried in .whl/ (RESULTS.md's software row says how they are built).
#
#   scripts/gpu_runs.sh speed  OUTDIR   GPU tests, then plain/zero3/fsdp2 and both offloads beside
#                                       DeepSpeed's, 3 interleaved repeats            (~7 min on an H100)
#   scripts/gpu_runs.sh sweep  OUTDIR   the background CPU Adam's thread count, stages 0-2, a traced
#                                       step of each offload (trace_summary.py), and the
#                                       activation-checkpointing peak                  (~8 min)
#   scripts/gpu_runs.sh capacity OUTDIR the largest GPT each variant trains            (~9 min)
#   scripts/gpu_runs.sh check  OUTDIR   prints the commands only (no GPU needed)
#
# Every command's output goes to OUTDIR (the device tool's $OUT); the summary lines also go to
# stdout. A part that runs out of time leaves what it measured so far.
set -uo pipefail
part=${1:?usage: scripts/gpu_runs.sh speed|sweep|capacity|check OUTDIR}
out=${2:?usage: scripts/gpu_runs.sh $part OUTDIR}
case $part in speed|sweep|capacity|check) ;; *) echo "unknown part '$part': speed, sweep, capacity or check"; exit 2 ;; esac
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0

run() {   # run NAME SECONDS COMMAND...: stdout to NAME.jsonl, stderr to NAME.txt, the table to stdout
    local name=$1 seconds=$2
    shift 2
    echo "== $name: ${DSLAUNCH_CPU_ADAM_THREADS:+DSLAUNCH_CPU_ADAM_THREADS=$DSLAUNCH_CPU_ADAM_THREADS }$*"
    [ "$part" = check ] && return 0
    timeout "$seconds" "$@" >"$out/$name.jsonl" 2>"$out/$name.txt"
    echo "   exit $?"
    grep -v '^\[bench\]' "$out/$name.txt" | tail -30   # the table and the medians
}

setup() {
    [ "$part" = check ] && return 0
    if ! python3 -c "import deepspeed" 2>/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl >/dev/null 2>&1 || { echo "no .whl/ to install DeepSpeed from"; exit 3; }
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    fi
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import os, torch, deepspeed; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__, 'cores', os.cpu_count())"
    date -u
}

bench=(python3 scripts/bench_engine.py --warmup 3 --steps 6)
setup
case $part in
  speed|check)
    echo "== gpu-tests: python3 -m pytest tests/gpu -m gpu -q"
    if [ "$part" = speed ]; then
        timeout 150 python3 -m pytest tests/gpu -m gpu -q >"$out/gpu-tests.txt" 2>&1
        tail -3 "$out/gpu-tests.txt"
    fi
    run repeat3 420 "${bench[@]}" --repeat 3 --timeout 120 --variants \
        plain,zero3,fsdp2,zero2_offload_overlap,zero3_offload_overlap,ds_zero2_offload,ds_zero3_offload
    ;;&
  sweep|check)
    for threads in 8 12 15 16; do
        DSLAUNCH_CPU_ADAM_THREADS=$threads run "threads-$threads" 90 "${bench[@]}" --timeout 80 \
            --variants plain,zero2_offload_overlap
    done
    run stages012 150 "${bench[@]}" --timeout 45 --variants plain,zero0,zero1,zero2
    for variant in zero2_offload_overlap zero3_offload_overlap; do   # where each offloaded step goes
        echo "== trace-$variant: python3 scripts/trace_steps.py --variant $variant --trace \$OUT/trace-$variant.json.gz"
        if [ "$part" = sweep ]; then
            timeout 100 python3 scripts/trace_steps.py --variant "$variant" --warmup 3 --steps 4 \
                --trace "$out/trace-$variant.json.gz" >"$out/trace-$variant.txt" 2>&1
            python3 scripts/trace_summary.py "$out/trace-$variant.json.gz" --top 6 | tee "$out/trace-$variant.summary"
        fi
    done
    echo "== activation-ckpt: python3 scripts/bench_activation_ckpt.py --batch-sizes 16 --steps 3"
    if [ "$part" = sweep ]; then
        timeout 120 python3 scripts/bench_activation_ckpt.py --batch-sizes 16 --steps 3 \
            >"$out/activation-ckpt.json" 2>"$out/activation-ckpt.txt"
        tail -5 "$out/activation-ckpt.txt"
    fi
    ;;&
  capacity|check)
    run capacity 540 python3 scripts/bench_capacity.py --tries 3 --timeout 120
    ;;
esac

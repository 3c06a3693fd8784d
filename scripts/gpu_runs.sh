#!/usr/bin/env bash
# The GPU measurements of benchmarks/RESULTS.md, in parts that each fit one device call
# (10 minutes): run from the repository root on the GPU machine, with the DeepSpeed wheel and its
# dependencies carried in device-carry/ (scripts/build_device_carry.sh builds it; it is git-ignored).
#
# Issue 39 (the GPU tier's acceptance run; docs/development/tests.md, "The GPU tier"):
#   scripts/gpu_runs.sh accept       OUTDIR  Llama (GQA), GPT-2, Qwen2 and Mixtral at ZeRO 0-3 in bf16, stage 2
#                                            in fp16 and stages 2/3 with optimizer offload, ours beside plain
#                                            PyTorch and DeepSpeed (same config, seed, batches), and a stock
#                                            Trainer at ZeRO-3; the table on stdout and in OUTDIR/accept.md
#                                            (also in accept.tar.gz); exits 1 if a cell is red  (~7.5 min)
#   scripts/gpu_runs.sh after OUTDIR        issue 42's inf/NaN trace step cost (zero2_nantrace vs zero2_nantrace_off) and
#                                            Qwen2's stages 1-3 beside plain (~3.5 min)
#   scripts/gpu_runs.sh compile OUTDIR      issue 39's compile ratios: plain eager and compiled, ours compiled at stages 0, 2 and 3,
#                                            on the 406M GPT and the HF Llama 1.24B, one process each (~8.5 min; on 2026-12-07
#                                            `after` held these with limits too short for stages 0 and 3)
#   scripts/gpu_runs.sh accept-tests OUTDIR  the same with a shorter budget, then the GPU tests if time is left
#                                            (a '-', not a '+': the packed file is named after the part)
# Issue 32 (estimates from the 2026-12-05 H100 figures; every command has its own time limit):
#   scripts/gpu_runs.sh speed3   OUTDIR  GPU tests, then plain / plain_compile / zero2_compile /
#                                        zero3_compile / fsdp2_compile, 3 interleaved repeats, and
#                                        DeepSpeed's compile at stages 2 and 3 once (~8 min)
#   scripts/gpu_runs.sh offload3 OUTDIR  both offloads (overlap_step) beside plain, 3 repeats; every
#                                        offload mode, ours and DeepSpeed's, once with bytes per
#                                        parameter; a traced step of each offload  (~7.5 min)
#   scripts/gpu_runs.sh llama    OUTDIR  transformers' LlamaForCausalLM (1.24B, GQA, batch 8 x 1024):
#                                        ours at stages 2/3 and with offload beside plain and DeepSpeed,
#                                        per-step losses, then gradient checkpointing (~7 min)
#   scripts/gpu_runs.sh capacity2 OUTDIR the largest GPT of stage 3 with offload (optimizer only, and
#                                        optimizer and parameters), bytes per parameter  (~8 min)
# Issue 43 item 1 (offload's 0.690 -> 0.645 between 6d3c329 and 7878aa9):
#   scripts/gpu_runs.sh offload-ab OUTDIR both overlapped offloads x3 beside plain, each also with torch's
#                                        pinned allocator for its host buffers (as on 6d3c329) instead of
#                                        exact-size registered pages (a00dc26); the floors and the A/B
#                                        judged by scripts/offload_floor.py; then the host side alone per
#                                        kind of buffer (bench_host_buffers.py); exits 1 on a regression (~6 min)
# Issue 43 item 3 (bf16 master weights, gradients and Adam moments):
#   scripts/gpu_runs.sh bf16-states OUTDIR stages 2/3 + offload (and overlap_step) with both bf16 keys beside
#                                        plain and DeepSpeed's same config: speed, per-step losses, bytes per
#                                        parameter of each  (~5 min)
#   scripts/gpu_runs.sh nvme OUTDIR    issue 43 item 4: stage 3 + optimizer offload to host memory against NVMe
#                                        files (fp32 and bf16 states) beside plain, 2 repeats, bytes per parameter;
#                                        the machine's disk (64 GiB) is below its host memory, so this is the step
#                                        cost of NVMe, not its capacity  (~5 min)
#   scripts/gpu_runs.sh ratio OUTDIR   issue 43 item 2's knob: stage 3 + optimizer offload with offload_optimizer.ratio 0.5
#                                        (half the sub-groups stepped on the GPU) beside ratio 1, with and without
#                                        overlap_step, and plain; 2 interleaved repeats, bytes per parameter  (~4 min)
#   scripts/gpu_runs.sh ratio2 OUTDIR  the same knob at stage 2 with overlap_step (ratio 0.5 and 1) beside plain (~3 min)
#   scripts/gpu_runs.sh capacity-bf16 OUTDIR the largest GPT of stage 3 + optimizer offload with bf16 states
#                                        (plain's was 5.05B, fp32 states' 9.88B on an H100)  (~6 min)
#   offload3 and offload-ab judge their repeats against the floors (scripts/offload_floor.py: on an
#   H100, 0.67x plain for both overlapped offloads); a missed floor prints REGRESSED and the part exits 1
# Issue 31 item 5:
#   scripts/gpu_runs.sh moe      OUTDIR  the GPT with an MoE layer every other block (8 experts, top-2,
#                                        ep 1; 1.1B parameters, batch 8 x 1024, bf16): plain PyTorch with
#                                        our layer, ours at stage 2, DeepSpeed's engine and MoE layer at
#                                        stage 2; 2 interleaved repeats, per-step losses (~6 min)
# Issue 19 (kept):
#   scripts/gpu_runs.sh speed|sweep|capacity OUTDIR
#   scripts/gpu_runs.sh check  OUTDIR   prints the commands of every part (no GPU needed)
#
# Every command's output goes to OUTDIR (the device tool's $OUT); the summary lines also go to
# stdout. A part that runs out of time leaves what it measured so far (each finished variant's
# JSON is on its [bench] line in NAME.txt). At the end everything but the traces is packed into
# OUTDIR/PART.tar.gz, since the device tool brings back at most 8 files.
set -uo pipefail
parts="accept|accept-tests|after|compile|speed3|offload3|offload-ab|ratio|ratio2|bf16-states|capacity-bf16|nvme|llama|capacity2|moe|speed|sweep|capacity|check"
part=${1:?usage: scripts/gpu_runs.sh $parts OUTDIR}
out=${2:?usage: scripts/gpu_runs.sh $part OUTDIR}
case $part in accept|accept-tests|after|compile|speed3|offload3|offload-ab|ratio|ratio2|bf16-states|capacity-bf16|nvme|llama|capacity2|moe|speed|sweep|capacity|check) ;;
  *) echo "unknown part '$part': ${parts//|/, }"; exit 2 ;; esac
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0

run() {   # run NAME SECONDS COMMAND...: stdout to NAME.jsonl, stderr to NAME.txt, the table to stdout
    local name=$1 seconds=$2
    shift 2
    echo "== $name: ${DSLAUNCH_CPU_ADAM_THREADS:+DSLAUNCH_CPU_ADAM_THREADS=$DSLAUNCH_CPU_ADAM_THREADS }$*"
    [ "$part" = check ] && return 0
    timeout "$seconds" "$@" >"$out/$name.jsonl" 2>"$out/$name.txt"
    echo "   exit $?"
    grep -v '^\[bench\]' "$out/$name.txt" | grep -v '^\[zero\]' | tail -40   # the tables and medians
}

gpu_tests() {   # gpu_tests SECONDS
    echo "== gpu-tests: python3 -m pytest tests/gpu -m gpu -q"
    [ "$part" = check ] && return 0
    timeout "$1" python3 -m pytest tests/gpu -m gpu -q >"$out/gpu-tests.txt" 2>&1
    tail -3 "$out/gpu-tests.txt"
}

floor() {   # floor NAME: judge NAME.jsonl's medians against the offload floors (a miss fails the part)
    echo "== floor-$1: python3 scripts/offload_floor.py \$OUT/$1.jsonl"
    [ "$part" = check ] && return 0
    python3 scripts/offload_floor.py "$out/$1.jsonl" | tee "$out/$1-floor.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
}

trace() {   # trace VARIANT SECONDS: where one offloaded step's time goes
    local variant=$1 seconds=$2
    echo "== trace-$variant: python3 scripts/trace_steps.py --variant $variant --trace \$OUT/trace-$variant.json.gz"
    [ "$part" = check ] && return 0
    timeout "$seconds" python3 scripts/trace_steps.py --variant "$variant" --warmup 3 --steps 4 \
        --trace "$out/trace-$variant.json.gz" >"$out/trace-$variant.txt" 2>&1
    python3 scripts/trace_summary.py "$out/trace-$variant.json.gz" --top 6 | tee "$out/trace-$variant.summary"
}

accept() {   # accept BUDGET: scripts/gpu_accept.py, its own budget BUDGET s (+40 s to stop a cell and report), the table to stdout
    local budget=$1
    echo "== accept: python3 scripts/gpu_accept.py \$OUT --budget $budget"
    [ "$part" = check ] && return 0
    timeout $((budget + 40)) python3 scripts/gpu_accept.py "$out" --budget "$budget" >"$out/accept.txt" 2>&1
    status=$?
    echo "   exit $status"
    # the device tool shows the last 12,000 characters: the table without plain's rows (all of it: accept.md)
    if [ -f "$out/accept.md" ]; then grep -v -E '^\| [a-z0-9]+ \| [a-z0-9_]+ \| plain \|' "$out/accept.md"
    else tail -30 "$out/accept.txt"; fi
}

setup() {
    [ "$part" = check ] && return 0
    if ! python3 -c "import deepspeed" 2>/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site device-carry/*.whl >/dev/null 2>&1 || { echo "no device-carry/ to install DeepSpeed from"; exit 3; }
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    fi
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import os, torch, deepspeed, transformers; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__, 'transformers', transformers.__version__, 'cores', os.cpu_count())"
    free -g | head -2
    grep -m1 'model name' /proc/cpuinfo   # offload is bound by the host: runs on other CPUs compare badly
    date -u
}

pack() {   # everything but the Chrome traces into one file; traces over 15 MiB are dropped
    [ "$part" = check ] && return 0
    (cd "$out" && find . -maxdepth 1 -type f ! -name '*.json.gz' ! -name "$part.tar.gz" -printf '%P\n' \
        | tar czf "$part.tar.gz" -T - --remove-files)
    find "$out" -maxdepth 1 -name '*.json.gz' -size +15M -delete
    ls -la "$out"
}
trap pack EXIT

bench=(python3 scripts/bench_engine.py --warmup 3 --steps 6)
status=0
setup
case $part in
  accept|check)
    accept "${ACCEPT_BUDGET:-520}"   # ACCEPT_BUDGET: less where less device time is left
    ;;&
  accept-tests|check)
    accept 390
    left=$((565 - SECONDS))   # the device tool stops a command at 600 s; pack needs a few
    if [ "$left" -ge 60 ] || [ "$part" = check ]; then gpu_tests "$left"; else echo "== gpu-tests: skipped, ${left}s left"; fi
    ;;&
  after|check)
    run nantrace 90 "${bench[@]}" --steps 8 --timeout 45 --peak-size 0 --variants zero2_nantrace,zero2_nantrace_off
    run qwen2 120 python3 scripts/bench_engine.py --model qwen2 --batch 8 --warmup 2 --steps 5 --timeout 35 \
        --peak-size 0 --variants plain,zero1,zero2,zero3
    ;;&
  compile|check)   # each compiled variant takes 45-60 s on an H100 (its compile included)
    run gpt-compile 240 "${bench[@]}" --timeout 90 \
        --variants plain,plain_compile,zero0_compile,zero2_compile,zero3_compile
    run llama-compile 250 python3 scripts/bench_engine.py --model llama --batch 8 --warmup 2 --steps 5 --timeout 90 \
        --peak-size 0 --variants plain_compile,zero0_compile,zero2_compile,zero3_compile
    ;;&
  speed3|check)
    gpu_tests 130
    run compile3 330 "${bench[@]}" --repeat 3 --budget 300 --timeout 150 --variants \
        plain,plain_compile,zero3_compile,fsdp2_compile,zero2_compile
    run ds-compile 95 "${bench[@]}" --peak-size 0 --budget 80 --timeout 80 --variants ds_zero3_compile
    ;;&
  offload3|check)
    run offload-repeat3 150 "${bench[@]}" --repeat 3 --budget 140 --timeout 60 --variants \
        plain,zero2_offload_overlap,zero3_offload_overlap
    floor offload-repeat3
    run offload-bytes 240 "${bench[@]}" --bytes --peak-size 0 --timeout 90 --variants \
        plain,zero2_offload,zero3_offload,zero3_offload_all,ds_zero2_offload,ds_zero3_offload,ds_zero3_offload_all
    trace zero2_offload_overlap 75
    trace zero3_offload_overlap 75
    ;;&
  offload-ab|check)
    run offload-ab 300 "${bench[@]}" --repeat 3 --budget 280 --timeout 60 --variants \
        plain,zero2_offload_overlap,zero2_offload_overlap_torch_pinned,zero3_offload_overlap,zero3_offload_overlap_torch_pinned
    floor offload-ab
    run host-buffers 120 python3 scripts/bench_host_buffers.py --repeat 3
    cat "$out/host-buffers.jsonl" 2>/dev/null
    ;;&
  ratio|check)
    run ratio 260 "${bench[@]}" --repeat 2 --budget 240 --bytes --peak-size 0 --timeout 60 --variants \
        plain,zero3_offload,zero3_offload_ratio50,zero3_offload_overlap,zero3_offload_overlap_ratio50
    ;;&
  ratio2|check)   # stages 1-2's ratio (dslaunch's own; DeepSpeed 0.19.8 refuses the key there)
    run ratio2 200 "${bench[@]}" --repeat 2 --budget 180 --bytes --peak-size 0 --timeout 50 --variants \
        plain,zero2_offload_overlap,zero2_offload_overlap_ratio50
    ;;&
  bf16-states|check)
    run bf16-states 290 "${bench[@]}" --bytes --peak-size 0 --timeout 90 --variants \
        plain,zero2_offload_bf16states,zero2_offload_overlap_bf16states,zero3_offload_bf16states,zero3_offload_overlap_bf16states,ds_zero2_offload_bf16states,ds_zero3_offload_bf16states
    ;;&
  nvme|check)
    [ "$part" = check ] || df -h /tmp | tail -1
    run nvme 290 "${bench[@]}" --repeat 2 --budget 260 --bytes --peak-size 0 --timeout 90 --variants \
        plain,zero3_offload,zero3_offload_nvme,zero3_offload_nvme_bf16states
    ;;&
  capacity-bf16|check)
    run capacity-bf16 360 python3 scripts/bench_capacity.py --variants zero3_offload_optimizer_bf16 --tries 3 --timeout 100
    ;;&
  llama|check)
    llama=(python3 scripts/bench_engine.py --model llama --batch 8 --seq 1024 --warmup 2 --steps 5)
    run llama 330 "${llama[@]}" --timeout 90 --variants \
        plain,zero2,zero3,zero2_offload_overlap,zero3_offload_overlap,ds_zero2,ds_zero3,ds_zero2_offload,ds_zero3_offload
    run llama-ckpt 110 "${llama[@]}" --grad-ckpt --peak-size 0 --timeout 50 --variants plain,zero3,ds_zero3
    ;;&
  capacity2|check)
    run capacity2-optimizer 330 python3 scripts/bench_capacity.py --variants zero3_offload_optimizer \
        --tries 3 --timeout 100
    run capacity2-all 220 python3 scripts/bench_capacity.py --variants zero3_offload_all --tries 2 --timeout 90
    ;;&
  moe|check)
    run moe 330 "${bench[@]}" --model moe --batch 8 --repeat 2 --budget 300 --timeout 120 --variants \
        plain,zero2,ds_zero2
    ;;&
  speed|check)
    gpu_tests 150
    run repeat3 420 "${bench[@]}" --repeat 3 --timeout 120 --variants \
        plain,zero3,fsdp2,zero2_offload_overlap,zero3_offload_overlap,ds_zero2_offload,ds_zero3_offload
    ;;&
  sweep|check)
    for threads in 8 12 15 16; do
        DSLAUNCH_CPU_ADAM_THREADS=$threads run "threads-$threads" 90 "${bench[@]}" --timeout 80 \
            --variants plain,zero2_offload_overlap
    done
    run stages012 150 "${bench[@]}" --timeout 45 --variants plain,zero0,zero1,zero2
    trace zero2_offload_overlap 100
    trace zero3_offload_overlap 100
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
exit $status

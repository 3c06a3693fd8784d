#!/usr/bin/env python3
"""Record a real DeepSpeed's losses for the scripts in tests/scripts/hf and tests/scripts/frameworks (issues 30, 41).

Runs every case below on 2 CPU ranks with the Python of an environment that has a real DeepSpeed,
transformers and accelerate (never this project's venv), and writes one JSON file per case to
tests/data/deepspeed-<version>/: the versions, the exact launch, and each run's report (the
per-step losses, the eval loss, ...). tests/dist/test_hf_trainer.py and test_hf_accelerate.py replay
the same runs under ``dslaunch --as-deepspeed`` and compare; tests/dist/test_lightning.py and test_trl.py
the framework cases (Lightning Fabric and Trainer, TRL's SFT and DPO trainers; the Python given needs
lightning and trl too, and the versions probe records theirs).

How DeepSpeed runs on CPU here: ``DS_ACCELERATOR=cpu`` (DeepSpeed's CPU accelerator; without
oneCCL its communication backend is gloo) and torchrun (``python -m torch.distributed.run
--nproc_per_node 2``), which gives each rank RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT.
DeepSpeed's own launcher works too (``deepspeed --num_gpus 2 --no_local_rank SCRIPT ...`` with
``DS_ACCELERATOR=cpu``; the Accelerate script takes no ``--local_rank``) and gave the same losses
for accelerate_zero2. The scripts need ``--use_cpu``: without it accelerate finds no device backend and every rank
thinks it is alone (world size 1). The Trainer gets it as a TrainingArguments flag; the
Accelerate script turns it into ``PartialState(cpu=True)`` before ``Accelerator(...)``, because
``Accelerator(cpu=True)`` (and ``accelerate launch --use_cpu``) quietly drops the DeepSpeed plugin.

    scripts/record_deepspeed_losses.py --python /work/dsref/bin/python [--only trainer_zero2 ...]

DeepSpeed JIT-builds its CPU ops (FusedAdam, the shm all-reduce) into ~/.cache/torch_extensions, one
folder per op for every DeepSpeed install on the machine: two installs in turn rebuild each other's ops,
and a run killed mid-build leaves a ``lock`` file that every later run waits on forever. Record with the
machine's one DeepSpeed install, or give another its own ``TORCH_EXTENSIONS_DIR``.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HF = "tests/scripts/hf"
ENV = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
WORLD_SIZE = 2

# Shared by every Trainer run: 10 optimizer steps of 2 micro-batches of 4 per rank (96 samples: 6 steps an
# epoch, so the run crosses an epoch), a checkpoint every 5 steps, a loss logged every step.
TRAINER_ARGS = ["--use_cpu", "--max_steps", "10", "--per_device_train_batch_size", "4",
                "--gradient_accumulation_steps", "2", "--per_device_eval_batch_size", "8",
                "--learning_rate", "5e-3", "--warmup_steps", "2", "--weight_decay", "0.01",
                "--logging_steps", "1", "--save_strategy", "steps", "--save_steps", "5", "--seed", "42",
                "--report_to", "none", "--disable_tqdm", "true"]
# The Accelerate script's own defaults: 10 steps of 4 per rank over 48 samples (6 steps an epoch).
ACCELERATE_ARGS = ["--use_cpu", "--max_steps", "10", "--save_at", "5"]


def trainer_run(stage: int, part: str, *extra: str) -> list[str]:
    return [f"{HF}/train_clm.py", "--deepspeed", f"{HF}/configs/zero{stage}.json", "--output_dir", "{out}/run",
            "--report", f"{{out}}/report-{part}.json", *TRAINER_ARGS, *extra]


def accelerate_run(stage: int, part: str, *extra: str) -> list[str]:
    return [f"{HF}/train_accelerate.py", "--ds_config", f"{HF}/configs/accelerate_zero{stage}.json",
            "--output_dir", "{out}/run", "--report", f"{{out}}/report-{part}.json", *ACCELERATE_ARGS, *extra]


def cases() -> dict[str, list[list[str]]]:
    """Case name -> the runs it is made of, in order ({out}: the case's own scratch folder)."""
    table = framework_cases()
    # training_data='s loader: its worker processes and when it draws its seed (random transforms, dropout)
    table["loader_rng"] = [["tests/dist/workers/loader_rng_worker.py", "--report", "{out}/report.json"]]
    for stage in range(4):
        table[f"trainer_zero{stage}"] = [trainer_run(stage, "straight")]
        table[f"trainer_zero{stage}_resume"] = [trainer_run(stage, "interrupted", "--stop_after_step", "5"),
                                                trainer_run(stage, "resumed", "--resume_from_checkpoint", "true")]
        table[f"accelerate_zero{stage}"] = [accelerate_run(stage, "straight")]
        table[f"accelerate_zero{stage}_resume"] = [
            accelerate_run(stage, "interrupted", "--stop_after_save"),
            accelerate_run(stage, "resumed", "--resume_from", "{out}/run/state_step5")]
    return table


# Frameworks that drive DeepSpeed themselves (issue 41), each its own DeepSpeed path unchanged
FRAMEWORKS = "tests/scripts/frameworks"


def fabric_run(stage: int, part: str, *extra: str) -> list[str]:
    return [f"{FRAMEWORKS}/lightning_fabric.py", "--stage", str(stage), "--report", f"{{out}}/report-{part}.json", *extra]


def lightning_trainer_run(stage: int, part: str, *extra: str) -> list[str]:
    return [f"{FRAMEWORKS}/lightning_trainer.py", "--stage", str(stage), "--report", f"{{out}}/report-{part}.json",
            *extra]


def trl_run(trainer: str, stage: int) -> list[str]:
    return [f"{FRAMEWORKS}/trl_train.py", "--trainer", trainer, "--deepspeed", f"{HF}/configs/zero{stage}.json",
            "--output_dir", "{out}/run", "--report", "{out}/report-straight.json"]


def framework_cases() -> dict[str, list[list[str]]]:
    """Lightning's strategies exist for stages 1-3 (deepspeed_stage_N); DPO's reference model is an
    engine without an optimizer (stage 0 beside a stage-2 run, stage 3 beside a stage-3 one)."""
    table = {}
    for stage in (1, 2, 3):
        table[f"lightning_fabric_zero{stage}"] = [fabric_run(stage, "straight")]
        table[f"lightning_trainer_zero{stage}"] = [lightning_trainer_run(stage, "straight", "--checkpoint", "{out}/ckpt")]
    table["lightning_fabric_zero3_resume"] = [
        fabric_run(3, "interrupted", "--save_at", "4", "--checkpoint", "{out}/ckpt", "--stop_after_save"),
        fabric_run(3, "resumed", "--resume_from", "{out}/ckpt")]
    table["lightning_trainer_zero2_resume"] = [
        lightning_trainer_run(2, "interrupted", "--epochs", "2", "--checkpoint", "{out}/ckpt"),
        lightning_trainer_run(2, "resumed", "--resume_from", "{out}/ckpt")]
    for stage in range(4):
        table[f"trl_sft_zero{stage}"] = [trl_run("sft", stage)]
    for stage in (2, 3):
        table[f"trl_dpo_zero{stage}"] = [trl_run("dpo", stage)]
    return table


# deepspeed.initialize(training_data=...)'s loader: which samples each rank gets (loader_order_worker.py)
LOADER_WORKER = "tests/dist/workers/loader_order_worker.py"
LOADER_CASES = [["engine", "51", "4", "2", "0"], ["engine", "51", "4", "2", "1"],
                ["pipe", "21", "2", "2", "1"], ["pipe", "21", "2", "2", "2"]]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def versions(python: str) -> dict:
    """The versions of DeepSpeed and of what drives it (transformers, accelerate, lightning, trl), where installed."""
    probe = ("import importlib.util, json, sys, deepspeed, torch\n"
             "found = {'deepspeed': deepspeed.__version__, 'torch': torch.__version__, 'python': sys.version.split()[0]}\n"
             "for name in ('transformers', 'accelerate', 'lightning', 'trl'):\n"
             "    if importlib.util.find_spec(name):\n"
             "        found[name] = __import__(name).__version__\n"
             "print(json.dumps(found))")
    done = subprocess.run([python, "-c", probe], env={**os.environ, **ENV}, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def torchrun(python: str, args: list[str], log: Path, label: str, timeout: float, must_pass: bool = True) -> int:
    """Run ``args`` on WORLD_SIZE ranks under torchrun with DeepSpeed's CPU settings; output to ``log``.
    Its exit code (a failure ends the recording unless ``must_pass`` is False)."""
    argv = [python, "-m", "torch.distributed.run", "--nproc_per_node", str(WORLD_SIZE), "--master_port",
            str(free_port()), *args]
    with log.open("a") as sink:
        sink.write(f"\n=== {label}: {shlex.join(argv)}\n")
        sink.flush()
        done = subprocess.run(argv, cwd=REPO, env={**os.environ, **ENV}, stdout=sink, stderr=subprocess.STDOUT,
                              timeout=timeout)
    if done.returncode != 0 and must_pass:
        raise SystemExit(f"{label}: DeepSpeed run failed (exit {done.returncode}); see {log}")
    return done.returncode


def run_case(python: str, name: str, runs: list[list[str]], log: Path) -> dict:
    recorded = []
    with tempfile.TemporaryDirectory(prefix=f"ds-{name}-") as scratch:
        for argv in runs:
            args = [a.replace("{out}", scratch) for a in argv]
            torchrun(python, args, log, name, timeout=900)
            report_path = args[args.index("--report") + 1]
            recorded.append({"args": argv, "report": json.loads(Path(report_path).read_text())})
    return {"runs": recorded}


def record_loader_order(python: str, log: Path) -> dict:
    recorded = []
    for case in LOADER_CASES:
        with tempfile.TemporaryDirectory(prefix="ds-loader-") as scratch:
            torchrun(python, [LOADER_WORKER, *case, "--out", scratch], log, f"loader_order {case}", timeout=600)
            ranks = [json.loads((Path(scratch) / f"rank{r}.json").read_text())["passes"] for r in range(WORLD_SIZE)]
        recorded.append({"args": case, "ranks": ranks})
    return {"cases": recorded}


# bf16 at ZeRO 0 and 1 (bf16_steps_worker.py): DeepSpeed's stage-0 bf16 path steps its own way (issue 30)
BF16_WORKER = "tests/dist/workers/bf16_steps_worker.py"


def record_bf16_steps(python: str, log: Path) -> dict:
    stages = {}
    for stage in (0, 1):
        with tempfile.TemporaryDirectory(prefix="ds-bf16-") as scratch:
            torchrun(python, [BF16_WORKER, str(stage), "--out", scratch], log, f"bf16_steps stage {stage}", timeout=600)
            stages[str(stage)] = json.loads((Path(scratch) / "rank0.json").read_text())
    return {"stages": stages}


# DeepSpeed 0.19's Muon (muon_steps_worker.py): Muon for matrices, its auxiliary Adam for the rest (issue 41)
MUON_WORKER = "tests/dist/workers/muon_steps_worker.py"


def record_muon_steps(python: str, log: Path) -> dict:
    stages = {}
    for stage in range(4):
        with tempfile.TemporaryDirectory(prefix="ds-muon-") as scratch:
            torchrun(python, [MUON_WORKER, str(stage), "--out", scratch], log, f"muon_steps stage {stage}", timeout=600)
            stages[str(stage)] = json.loads((Path(scratch) / "rank0.json").read_text())
    return {"stages": stages}


# bf16 masters, gradients and Adam moments (bf16_states_worker.py): the bf16 section's two keys, with
# optimizer offload at stages 1-3, and bf16_optimizer_states without offload (DeepSpeed allows that pair alone)
BF16_STATES_WORKER = "tests/dist/workers/bf16_states_worker.py"
BF16_STATES_CASES = [(stage, keys, "cpu") for stage in (1, 2, 3) for keys in ("masters", "states")] + \
                    [(stage, "states", "none") for stage in (1, 2, 3)]


def record_bf16_states(python: str, log: Path) -> dict:
    """``STAGE/KEYS/OFFLOAD`` -> rank 0's report."""
    runs = {}
    for stage, keys, offload in BF16_STATES_CASES:
        with tempfile.TemporaryDirectory(prefix="ds-bf16-states-") as scratch:
            torchrun(python, [BF16_STATES_WORKER, str(stage), keys, offload, "--out", scratch], log,
                     f"bf16_states stage {stage} {keys} offload {offload}", timeout=900)
            runs[f"{stage}/{keys}/{offload}"] = json.loads((Path(scratch) / "rank0.json").read_text())
    return {"runs": runs}


# partial optimizer offload at stage 3 (partial_offload_worker.py): offload_optimizer.ratio; on a CPU host
# DeepSpeed's accelerator is the CPU, so every sub-group it keeps "on the device" steps on the CPU as well
PARTIAL_OFFLOAD_WORKER = "tests/dist/workers/partial_offload_worker.py"
PARTIAL_OFFLOAD_RATIOS = ("1.0", "0.5", "0.25")


def record_partial_offload(python: str, log: Path) -> dict:
    """``RATIO`` -> rank 0's report."""
    runs = {}
    for ratio in PARTIAL_OFFLOAD_RATIOS:
        with tempfile.TemporaryDirectory(prefix="ds-partial-offload-") as scratch:
            torchrun(python, [PARTIAL_OFFLOAD_WORKER, ratio, "--out", scratch], log, f"partial_offload ratio {ratio}",
                     timeout=900)
            runs[ratio] = json.loads((Path(scratch) / "rank0.json").read_text())
    return {"runs": runs}


# the optimizer deepspeed.initialize returns, stepped the ways frameworks step it (returned_optimizer_worker.py)
RETURNED_WORKER = "tests/dist/workers/returned_optimizer_worker.py"
RETURNED_LOOPS = ("engine", "optimizer", "both", "lightning")


def record_returned_optimizer(python: str, log: Path) -> dict:
    """Per stage and loop: rank 0's report, or the error DeepSpeed stopped with (its last ``Error:`` line)."""
    runs = {}
    for stage in range(4):
        for loop in RETURNED_LOOPS:
            runs[f"{stage}/{loop}"] = returned_optimizer_run(python, stage, loop, log)
    return {"runs": runs}


def returned_optimizer_run(python: str, stage: int, loop: str, log: Path, attempts: int = 3) -> dict:
    """One run; a rank that dies without a Python error (now and then DeepSpeed's CPU build aborts
    with SIGABRT on this machine) is run again, up to ``attempts`` times."""
    for _ in range(attempts):
        with tempfile.TemporaryDirectory(prefix="ds-returned-") as scratch:
            start = log.stat().st_size if log.exists() else 0
            code = torchrun(python, [RETURNED_WORKER, str(stage), loop, "--out", scratch], log,
                            f"returned_optimizer stage {stage} {loop}", timeout=600, must_pass=False)
            if code == 0:
                return {"report": json.loads((Path(scratch) / "rank0.json").read_text())}
            with log.open() as lines:
                lines.seek(start)
                errors = [line.strip() for line in lines if "Error:" in line and "[rank0]" in line]
            if errors:
                return {"exit_code": code, "error": errors[-1]}
    raise SystemExit(f"returned_optimizer stage {stage} {loop}: crashed {attempts} times without an error; see {log}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="/work/dsref/bin/python", help="a Python with a real DeepSpeed")
    parser.add_argument("--only", nargs="*", help="case names, loader_order, bf16_steps, bf16_states, muon_steps, "
                                                   "partial_offload and returned_optimizer among them (default: all)")
    parser.add_argument("--log", default="/tmp/record_deepspeed_losses.log")
    options = parser.parse_args()

    found = versions(options.python)
    out_dir = REPO / "tests" / "data" / f"deepspeed-{found['deepspeed']}"
    out_dir.mkdir(parents=True, exist_ok=True)
    launch = {"env": ENV, "command": f"{options.python} -m torch.distributed.run --nproc_per_node {WORLD_SIZE} "
                                     "--master_port PORT SCRIPT ARGS...", "cwd": "the repository root"}
    if not options.only or "loader_order" in options.only:
        record = {"case": "loader_order", "versions": found, "launch": launch, "world_size": WORLD_SIZE,
                  "worker": LOADER_WORKER, **record_loader_order(options.python, Path(options.log))}
        (out_dir / "loader_order.json").write_text(json.dumps(record) + "\n")
        print("loader_order: recorded", len(record["cases"]), "cases", flush=True)
    if not options.only or "bf16_steps" in options.only:
        record = {"case": "bf16_steps", "versions": found, "launch": launch, "world_size": WORLD_SIZE,
                  "worker": BF16_WORKER, **record_bf16_steps(options.python, Path(options.log))}
        (out_dir / "bf16_steps.json").write_text(json.dumps(record, indent=1) + "\n")
        print("bf16_steps: recorded stages", sorted(record["stages"]), flush=True)
    if not options.only or "muon_steps" in options.only:
        record = {"case": "muon_steps", "versions": found, "launch": launch, "world_size": WORLD_SIZE,
                  "worker": MUON_WORKER, **record_muon_steps(options.python, Path(options.log))}
        (out_dir / "muon_steps.json").write_text(json.dumps(record, indent=1) + "\n")
        print("muon_steps: recorded stages", sorted(record["stages"]), flush=True)
    if not options.only or "bf16_states" in options.only:
        record = {"case": "bf16_states", "versions": found, "launch": launch, "world_size": WORLD_SIZE,
                  "worker": BF16_STATES_WORKER, **record_bf16_states(options.python, Path(options.log))}
        (out_dir / "bf16_states.json").write_text(json.dumps(record, indent=1) + "\n")
        print("bf16_states: recorded", sorted(record["runs"]), flush=True)
    if not options.only or "partial_offload" in options.only:
        record = {"case": "partial_offload", "versions": found, "launch": launch, "world_size": WORLD_SIZE,
                  "worker": PARTIAL_OFFLOAD_WORKER, **record_partial_offload(options.python, Path(options.log))}
        (out_dir / "partial_offload.json").write_text(json.dumps(record, indent=1) + "\n")
        print("partial_offload: recorded", sorted(record["runs"]), flush=True)
    if not options.only or "returned_optimizer" in options.only:
        record = {"case": "returned_optimizer", "versions": found, "launch": launch, "world_size": WORLD_SIZE,
                  "worker": RETURNED_WORKER, **record_returned_optimizer(options.python, Path(options.log))}
        (out_dir / "returned_optimizer.json").write_text(json.dumps(record, indent=1) + "\n")
        print("returned_optimizer: recorded", sorted(record["runs"]), flush=True)
    for name, runs in cases().items():
        if options.only and name not in options.only:
            continue
        record = {"case": name, "versions": found, "launch": launch, "world_size": WORLD_SIZE,
                  **run_case(options.python, name, runs, Path(options.log))}
        (out_dir / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
        print(summary(name, record), flush=True)
    return 0


def summary(name: str, record: dict) -> str:
    report = record["runs"][-1]["report"]
    steps = report["steps"]
    line = (f"{name}: {len(steps)} steps logged, first loss {steps[0]['loss']:.6f} (step {steps[0]['step']}), "
            f"last {steps[-1]['loss']:.6f} (step {steps[-1]['step']})")
    return line + (f", eval {report['eval_loss']:.6f}" if "eval_loss" in report else "")


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Record DeepSpeed runs stopped at a step and continued, with their checkpoints (test data for issue 41 item 4).

For each ZeRO stage, precision and world size: a straight run of tests/dist/workers/switch_worker.py
(8 steps, a checkpoint after step 4) and the same run continued from that checkpoint, both on a
real DeepSpeed. Writes tests/data/deepspeed-<version>/switch.json (the versions, the launch, each
run's report) and the checkpoint folders under tests/data/deepspeed-<version>/switch/<case>/
(``latest`` and the tag folder; DeepSpeed's copied zero_to_fp32.py and zero_to_torch.py are left
out). tests/dist/test_deepspeed_switch.py continues those checkpoints on this engine and compares.

DeepSpeed runs on CPU as in record_deepspeed_losses.py (``DS_ACCELERATOR=cpu``, gloo, torchrun). Its
CPU accelerator allows fp16 only where mkldnn has fp16 kernels ("Type fp16 is not supported on your
device" elsewhere); the fp16 cases run with the worker's ``--allow_fp16_on_cpu 1``, which answers that
check True (torch's CPU kernels run fp16 anyway; switch.json says so). Give DeepSpeed its own
``TORCH_EXTENSIONS_DIR`` where other environments share the machine (a different torch rebuilds
the shared ops on every start):

    TORCH_EXTENSIONS_DIR=/tmp/ds-ext scripts/record_deepspeed_switch.py [--only zero2-fp32-ws2 ...]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKER = "tests/dist/workers/switch_worker.py"
ENV = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
STAGES, PRECISIONS, WORLD_SIZES = (0, 1, 2, 3), ("fp32", "bf16", "fp16"), (1, 2)


def case_name(stage: int, precision: str, world_size: int) -> str:
    return f"zero{stage}-{precision}-ws{world_size}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def versions(python: str) -> dict:
    probe = ("import json, sys, deepspeed, torch; print(json.dumps({'deepspeed': deepspeed.__version__, "
             "'torch': torch.__version__, 'python': sys.version.split()[0]}))")
    done = subprocess.run([python, "-c", probe], env={**os.environ, **ENV}, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def torchrun(python: str, world_size: int, args: list[str], log: Path) -> tuple[int, str]:
    """Run the worker on ``world_size`` ranks; its exit code and rank 0's last error line ('' if none)."""
    argv = [python, "-m", "torch.distributed.run", "--nproc_per_node", str(world_size), "--master_port",
            str(free_port()), WORKER, *args]
    start = log.stat().st_size if log.exists() else 0
    with log.open("a") as sink:
        sink.write(f"\n=== {shlex.join(argv)}\n")
        sink.flush()
        done = subprocess.run(argv, cwd=REPO, env={**os.environ, **ENV, "PYTHONPATH": str(REPO)}, stdout=sink,
                              stderr=subprocess.STDOUT, timeout=1200)
    with log.open() as lines:
        lines.seek(start)
        errors = [line.strip() for line in lines if "Error: " in line and line.startswith("[rank0]")]
    return done.returncode, errors[-1] if errors else ""


def record_case(python: str, stage: int, precision: str, world_size: int, out_dir: Path, log: Path) -> dict:
    """The straight run and its continuation; the checkpoint copied into ``out_dir``."""
    with tempfile.TemporaryDirectory(prefix="ds-switch-") as scratch:
        folder, straight, resumed = Path(scratch) / "ckpt", Path(scratch) / "straight.json", Path(scratch) / "resumed.json"
        common = [str(stage), precision] + (["--allow_fp16_on_cpu", "1"] if precision == "fp16" else [])
        code, error = torchrun(python, world_size, [*common, "--save", str(folder), "--out", str(straight)], log)
        if code != 0:
            return {"exit_code": code, "error": error}
        code, error = torchrun(python, world_size, [*common, "--load", str(folder), "--out", str(resumed)], log)
        if code != 0:
            return {"straight": json.loads(straight.read_text()), "resume_exit_code": code, "resume_error": error}
        shutil.rmtree(out_dir, ignore_errors=True)
        shutil.copytree(folder, out_dir, ignore=shutil.ignore_patterns("*.py"))
        return {"straight": json.loads(straight.read_text()), "resumed": json.loads(resumed.read_text())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="a Python with a real DeepSpeed (default: this one)")
    parser.add_argument("--only", nargs="*", help="case names such as zero2-fp32-ws2 (default: all)")
    parser.add_argument("--log", default="/tmp/record_deepspeed_switch.log")
    options = parser.parse_args()
    found = versions(options.python)
    data = REPO / "tests" / "data" / f"deepspeed-{found['deepspeed']}"
    record_path = data / "switch.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {"cases": {}}
    record.update({"case": "switch", "versions": found, "worker": WORKER,
                   "fp16": "DeepSpeed's CPU accelerator refuses fp16 without mkldnn fp16 kernels; the fp16 cases "
                           "ran with --allow_fp16_on_cpu 1, which answers its is_fp16_supported() True",
                   "launch": {
        "env": ENV, "command": f"{options.python} -m torch.distributed.run --nproc_per_node WORLD_SIZE "
                               "--master_port PORT SCRIPT ARGS...", "cwd": "the repository root"}})
    for stage in STAGES:
        for precision in PRECISIONS:
            for world_size in WORLD_SIZES:
                name = case_name(stage, precision, world_size)
                if options.only and name not in options.only:
                    continue
                result = record_case(options.python, stage, precision, world_size, data / "switch" / name,
                                     Path(options.log))
                record["cases"][name] = {"stage": stage, "precision": precision, "world_size": world_size, **result}
                record_path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
                print(name, "recorded" if "resumed" in result else f"failed: {result}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A running job switched between DeepSpeed 0.19.8 and dslaunch's engine mid-training, both ways:
the per-step loss differences, as a table (issue 41 item 4; docs/migrating/switching.md).

In: each DeepSpeed checkpoint recorded in tests/data/deepspeed-0.19.8/switch/ (DeepSpeed stopped
after step 4 of tests/dist/workers/switch_worker.py) continued on this engine at the world size
it was saved with and at the other one, against DeepSpeed's own continuation (switch.json).

Out (needs a real DeepSpeed): the same run on this engine, saved after step 4, written in
DeepSpeed's layout by dslaunch-to-deepspeed for the same and the other world size, continued by
DeepSpeed's load_checkpoint, against this engine's straight run; and DeepSpeed's zero_to_fp32 of
the written folder against dslaunch-zero-to-fp32 of the original.

    scripts/deepspeed_switch.py [--direction in|out|both] [--only zero2-fp32-ws2 ...] [--moves 1:1 2:1] [--json FILE]

DeepSpeed runs on CPU (``DS_ACCELERATOR=cpu``, gloo, torchrun) with this Python; set
``TORCH_EXTENSIONS_DIR`` to a folder of its own where other environments share the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:   # run as a script: the engine's checkpoint tools are imported from this checkout
    sys.path.insert(0, str(REPO))
WORKER = REPO / "tests" / "dist" / "workers" / "switch_worker.py"
DATA = REPO / "tests" / "data" / "deepspeed-0.19.8"
ENV = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(argv: list[str], timeout: float) -> None:
    env = {**os.environ, **ENV, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def run_worker(engine: str, world_size: int, stage: int, precision: str, *flags: str, timeout: float = 900) -> dict:
    """One run of the worker on ``world_size`` CPU ranks, on DeepSpeed (torchrun) or this engine (dslaunch)."""
    with tempfile.TemporaryDirectory(prefix="switch-") as scratch:
        out = Path(scratch) / "report.json"
        args = [str(WORKER), str(stage), precision, "--engine", engine, *flags, "--out", str(out)]
        if engine == "deepspeed" and precision == "fp16":   # its CPU accelerator asks mkldnn (switch_worker.py)
            args += ["--allow_fp16_on_cpu", "1"]
        launcher = (["-m", "torch.distributed.run", "--nproc_per_node"] if engine == "deepspeed"
                    else ["-m", "launcher", "--no_local_rank", "--num_gpus"])
        _run([sys.executable, *launcher, str(world_size), "--master_port", str(free_port()), *args], timeout)
        return json.loads(out.read_text())


def loss_gaps(ours: dict, theirs: dict) -> dict[str, float]:
    """Per step both logged: |ours - theirs|."""
    return {step: abs(ours["steps"][step]["loss"] - theirs["steps"][step]["loss"])
            for step in theirs["steps"] if step in ours["steps"]}


def steps_before_growth(report: dict) -> list[str]:
    """The steps up to and including the first whose update grew the fp16 loss scale: DeepSpeed
    unscales such a step's gradients by the grown scale, this engine by the one they were computed
    with, so only the steps after it differ (tests/dist/test_deepspeed_switch.py)."""
    steps, scale = sorted(report["steps"], key=int), report["loaded"]["loss_scale"]
    for index, step in enumerate(steps):
        if report["steps"][step]["loss_scale"] > scale:
            return steps[:index + 1]
        scale = report["steps"][step]["loss_scale"]
    return steps


def switch_in(name: str, world_size: int) -> dict:
    """A recorded DeepSpeed checkpoint continued here at ``world_size``, against DeepSpeed's continuation."""
    case = json.loads((DATA / "switch.json").read_text())["cases"][name]
    ours = run_worker("dslaunch", world_size, case["stage"], case["precision"], "--load", str(DATA / "switch" / name))
    gaps = loss_gaps(ours, case["resumed"])
    early = max(gaps[s] for s in steps_before_growth(case["resumed"])) if case["precision"] == "fp16" else None
    return {"ours": ours, "gaps": gaps, "before_growth": early}


def switch_out(stage: int, precision: str, world_size: int, load_world_size: int, scratch: Path) -> dict:
    """This engine's run saved after step 4, written for DeepSpeed, continued there; and zero_to_fp32's weights."""
    from launcher.zero.checkpoint.consolidate import get_fp32_state_dict_from_zero_checkpoint
    from launcher.zero.checkpoint.deepspeed_convert import convert

    saved, written = scratch / "ours", scratch / "deepspeed"
    straight = run_worker("dslaunch", world_size, stage, precision, "--save", str(saved))
    convert(saved, written, world_size=load_world_size)
    theirs = run_worker("deepspeed", load_world_size, stage, precision, "--load", str(written))
    fp32_gap = None
    if stage > 0:   # zero_to_fp32 reads ZeRO checkpoints only
        import torch

        consolidated = scratch / "zero_to_fp32.pt"
        _run([sys.executable, "-c", "import sys, torch; from deepspeed.utils.zero_to_fp32 import "
              "get_fp32_state_dict_from_zero_checkpoint as get; torch.save(get(sys.argv[1]), sys.argv[2])",
              str(written), str(consolidated)], timeout=600)
        mine, deepspeeds = get_fp32_state_dict_from_zero_checkpoint(saved), torch.load(consolidated)
        fp32_gap = max(float((mine[k] - deepspeeds[k]).abs().max()) for k in mine)
    gaps = loss_gaps(theirs, straight)
    early = max(gaps[s] for s in steps_before_growth(theirs)) if precision == "fp16" else None
    return {"ours": straight, "deepspeed": theirs, "gaps": gaps, "before_growth": early, "zero_to_fp32_gap": fp32_gap}


def table(rows: list[dict]) -> str:
    lines = ["| direction | stage | precision | saved on | continued on | max loss difference | "
             "until the fp16 scale grows | zero_to_fp32 |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        fp32 = "-" if row.get("zero_to_fp32_gap") is None else f"{row['zero_to_fp32_gap']:.1e}"
        early = "-" if row.get("before_growth") is None else f"{row['before_growth']:.1e}"
        lines.append(f"| {row['direction']} | {row['stage']} | {row['precision']} | {row['saved']} | "
                     f"{row['continued']} | {max(row['gaps'].values()):.1e} | {early} | {fp32} |")
    return "\n".join(lines)


def cases(only) -> list[tuple[int, str, int]]:
    found = [(s, p, w) for s in range(4) for p in ("fp32", "bf16", "fp16") for w in (1, 2)]
    return [c for c in found if not only or f"zero{c[0]}-{c[1]}-ws{c[2]}" in only]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--direction", choices=("in", "out", "both"), default="both")
    parser.add_argument("--only", nargs="*", help="cases such as zero2-fp32-ws2 (the world size saved on)")
    parser.add_argument("--moves", nargs="*", default=["1:1", "1:2", "2:2", "2:1"],
                        help="SAVED:CONTINUED world sizes to run (default: all four)")
    parser.add_argument("--json", help="also write every row (with both runs' reports) here")
    options = parser.parse_args()
    rows = []
    for stage, precision, world_size in cases(options.only):
        for load_world_size in (world_size, 3 - world_size):
            if f"{world_size}:{load_world_size}" not in options.moves:
                continue
            common = {"stage": stage, "precision": precision, "saved": world_size, "continued": load_world_size}
            if options.direction in ("in", "both"):
                rows.append({"direction": "DeepSpeed -> dslaunch", **common,
                             **switch_in(f"zero{stage}-{precision}-ws{world_size}", load_world_size)})
                print(table(rows[-1:]).splitlines()[-1], flush=True)
            if options.direction in ("out", "both"):
                with tempfile.TemporaryDirectory(prefix="switch-out-") as scratch:
                    rows.append({"direction": "dslaunch -> DeepSpeed", **common,
                                 **switch_out(stage, precision, world_size, load_world_size, Path(scratch))})
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    if options.json:
        Path(options.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Faults at random, counted (issue 33): N rounds of a real training job, one fault per round.

Each round launches ``dslaunch --max_restarts 2`` on a 2-rank ZeRO-2 job that checkpoints every
few steps and resumes from ``latest``, injects one fault at a random moment, and checks:
no process of the round left (every process carries DSLAUNCH_CHAOS=<round> in its environment),
the exit code the docs give for that fault, and, where the job finished, final weights equal to
a single-process run fed the same global batches. It prints a table per fault kind.

    python scripts/chaos.py --rounds 100 [--seed 1] [--kinds kill_rank,stuck_rank]

This version runs the ranks on this machine (the local runner); ``full_disk`` (root only) puts
the checkpoints on a tmpfs that fills up at a random save, and checks that ``latest`` still names
a complete checkpoint. The faults that need the local cluster (an agent's SIGKILL, a cut link,
sshd stopped before a restart) are not in it yet. ``python scripts/chaos.py --worker DIR`` is one rank of the job.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, SAVE_EVERY, BATCH = 12, 3, 8
HANG_S = 240.0
# fault -> the exit code dslaunch documents for it (README, "Exit codes")
EXPECTED = {"none": 0, "kill_rank": 0, "kill_in_checkpoint": 0, "stuck_rank": 0,   # restarted, finished
            "kill_dslaunch": 128 + signal.SIGKILL, "term_dslaunch": 128 + signal.SIGTERM,
            "int_dslaunch": 130,
            "full_disk": 2}   # a CheckpointError on every try: the engine's exit code for it


# ---- one rank of the job -------------------------------------------------------------------------
def config() -> dict:
    return {"train_batch_size": BATCH, "gradient_clipping": 0.0, "zero_optimization": {"stage": 2},
            "optimizer": {"type": "AdamW", "params": {"lr": 0.02, "weight_decay": 0.01}}}


def global_batch(step: int):
    import torch

    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, 8, generator=gen), torch.randn(BATCH, 2, generator=gen)


def build_model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))


def worker(directory: str) -> None:
    import torch
    from launcher import zero

    engine, _, _, _ = zero.initialize(model=build_model(), config=config())
    rank, world = engine.dist_context.rank, engine.dist_context.world_size
    ckpt = os.path.join(directory, "ckpt")
    if os.path.exists(os.path.join(ckpt, "latest")):
        engine.load_checkpoint(ckpt)
    stuck_marker = os.path.join(directory, "stuck-once")
    while engine.global_steps < STEPS:
        step = engine.global_steps
        if rank == world - 1 and os.environ.get("CHAOS_STUCK_AT") == str(step) and not os.path.exists(stuck_marker):
            open(stuck_marker, "w").close()   # stuck on the first try only: the restart finishes
            while True:
                time.sleep(1)
        x, y = global_batch(step)
        share = BATCH // world
        x, y = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()
        if engine.global_steps % SAVE_EVERY == 0:
            engine.save_checkpoint(ckpt)
    if rank == 0:
        torch.save([p.detach().clone() for p in engine.module.parameters()], os.path.join(directory, "final.pt"))


def reference() -> list:
    """The same steps in one process with torch's AdamW on the whole global batch."""
    import torch

    model = build_model()
    params = config()["optimizer"]["params"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=params["lr"], weight_decay=params["weight_decay"])
    for step in range(STEPS):
        x, y = global_batch(step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


# ---- the rounds ----------------------------------------------------------------------------------
def processes_of(tag: str) -> dict[int, dict[str, str]]:
    """pid -> environment of every process that carries DSLAUNCH_CHAOS=tag."""
    found = {}
    needle = f"DSLAUNCH_CHAOS={tag}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                raw = handle.read()
        except OSError:
            continue
        if needle in raw.split(b"\0"):
            env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
            found[int(name)] = env
    return found


def rank_pids(tag: str, launcher_pid: int) -> list[int]:
    return [pid for pid, env in processes_of(tag).items() if "RANK" in env and pid != launcher_pid]


def inject(kind: str, proc: subprocess.Popen, tag: str, directory: str, rng: random.Random) -> None:
    """Wait for a random moment of the running job, then do the fault."""
    deadline = time.monotonic() + HANG_S / 2
    while time.monotonic() < deadline and proc.poll() is None and len(rank_pids(tag, proc.pid)) < 2:
        time.sleep(0.1)
    if kind == "kill_in_checkpoint":   # the moment a checkpoint's partial folder exists
        ckpt = os.path.join(directory, "ckpt")
        while time.monotonic() < deadline and proc.poll() is None:
            if os.path.isdir(ckpt) and any(name.endswith(".partial") for name in os.listdir(ckpt)):
                break
            time.sleep(0.005)
    else:
        time.sleep(rng.uniform(0.0, 4.0))
    if proc.poll() is not None:
        return
    if kind in ("kill_rank", "kill_in_checkpoint"):
        pids = rank_pids(tag, proc.pid)
        if pids:
            os.kill(rng.choice(pids), signal.SIGKILL)
    elif kind == "kill_dslaunch":
        proc.send_signal(signal.SIGKILL)
    elif kind == "term_dslaunch":
        proc.send_signal(signal.SIGTERM)
    elif kind == "int_dslaunch":
        proc.send_signal(signal.SIGINT)


def run_round(number: int, kind: str, rng: random.Random, want, python: str) -> dict:
    import torch

    directory = tempfile.mkdtemp(prefix=f"dslaunch-chaos-{number}-")
    tag = f"{os.getpid()}-{number}"
    env = {**os.environ, "DSLAUNCH_CHAOS": tag, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    env.pop("DSLAUNCH_DEBUG", None)
    argv = [python, "-m", "launcher", "--num_gpus", "2", "--master_port", "0", "--no_local_rank",
            "--max_restarts", "2", "--stall_timeout", "6", os.path.abspath(__file__), "--worker", directory]
    if kind == "stuck_rank":
        env["CHAOS_STUCK_AT"] = str(rng.randrange(1, STEPS))
    disk = os.path.join(directory, "ckpt") if kind == "full_disk" else None
    if disk is not None:   # room for one to three of the job's four checkpoints (about 60 KiB each)
        os.makedirs(disk)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={rng.randrange(70, 200)}k", "tmpfs", disk], check=True)
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if kind not in ("none", "stuck_rank"):
        inject(kind, proc, tag, directory, rng)
    hang = False
    try:
        output, _ = proc.communicate(timeout=max(1.0, HANG_S - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        hang = True
        proc.kill()
        output, _ = proc.communicate()
    code = 128 - proc.returncode if proc.returncode < 0 else proc.returncode
    left = processes_of(tag)
    for _ in range(50):   # a process that is ending gets 5 s
        if not left:
            break
        time.sleep(0.1)
        left = processes_of(tag)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    final = os.path.join(directory, "final.pt")
    wrong = False
    if os.path.exists(final):
        got = torch.load(final)
        wrong = not all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got, want))
    finished = os.path.exists(final)
    if disk is not None:
        wrong = not _latest_is_complete(disk)   # the last complete checkpoint is the one 'latest' names
        subprocess.run(["umount", "-l", disk], check=False)
    shutil.rmtree(directory, ignore_errors=True)
    ok = not hang and not left and code == EXPECTED[kind] and not wrong and (finished or EXPECTED[kind] != 0)
    if not ok:
        print(f"round {number} ({kind}) failed: exit {code} (expected {EXPECTED[kind]}), hang={hang}, "
              f"orphans={len(left)}, wrong weights={wrong}, finished={finished}; last output:\n"
              + "\n".join(output.splitlines()[-15:]), flush=True)
    return {"kind": kind, "ok": ok, "orphans": len(left), "hang": hang, "wrong": wrong, "code_ok": code == EXPECTED[kind]}


def _latest_is_complete(ckpt: str) -> bool:
    latest = os.path.join(ckpt, "latest")
    if not os.path.exists(latest):
        return not any(name.startswith("global_step") for name in os.listdir(ckpt))
    with open(latest, encoding="utf-8") as handle:
        tag = handle.read().strip()
    leftovers = [name for name in os.listdir(ckpt) if name.endswith(".partial")]
    return os.path.isfile(os.path.join(ckpt, tag, "metadata.json")) and not leftovers


def table(results: list[dict]) -> str:
    lines = ["| fault | rounds | passed | orphans | hangs | wrong weights | wrong exit code |", "|---|---|---|---|---|---|---|"]
    for kind in sorted({r["kind"] for r in results}) + ["all"]:
        rows = [r for r in results if kind in ("all", r["kind"])]
        lines.append(f"| {kind} | {len(rows)} | {sum(r['ok'] for r in rows)} | {sum(r['orphans'] for r in rows)} | "
                     f"{sum(r['hang'] for r in rows)} | {sum(r['wrong'] for r in rows)} | "
                     f"{sum(not r['code_ok'] for r in rows)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kinds", default=",".join(k for k in EXPECTED if k != "none"))
    parser.add_argument("--table", metavar="PATH", help="rewrite the table here after every round")
    parser.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    kinds = args.kinds.split(",")
    if os.geteuid() != 0 and "full_disk" in kinds:
        kinds.remove("full_disk")   # a tmpfs needs root
    unknown = [k for k in kinds if k not in EXPECTED]
    if unknown:
        parser.error(f"unknown fault kind(s) {unknown}; known: {', '.join(EXPECTED)}")
    rng = random.Random(args.seed)
    want = reference()
    results = []
    for number in range(args.rounds):
        kind = kinds[number % len(kinds)] if number < len(kinds) else rng.choice(kinds)
        results.append(run_round(number, kind, rng, want, sys.executable))
        print(f"round {number}: {kind}: {'passed' if results[-1]['ok'] else 'FAILED'}", flush=True)
        if args.table:
            with open(args.table, "w", encoding="utf-8") as handle:
                handle.write(f"{len(results)} of {args.rounds} rounds (seed {args.seed})\n{table(results)}\n")
    print(table(results))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

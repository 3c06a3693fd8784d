#!/usr/bin/env python3
"""Faults at random, counted (issue 33): N rounds of a real training job, one fault per round.

Each round launches ``dslaunch --max_restarts 2`` on a 2-rank ZeRO-2 job that checkpoints every
few steps and resumes from ``latest``, injects one fault at a random moment, and checks:
no process of the round left (every process carries DSLAUNCH_CHAOS=<round> in its environment),
the exit code the docs give for that fault, and, where the job finished, final weights equal to
a single-process run fed the same global batches. It prints a table per fault kind.

    python scripts/chaos.py --rounds 100 [--seed 1] [--kinds kill_rank,stuck_rank]

By default the ranks run on this machine (the local runner); ``full_disk`` (root only) puts
the checkpoints on a tmpfs that fills up at a random save, and checks that ``latest`` still names
a complete checkpoint. ``--cluster NAME`` (root) runs the job across 3 nodes of a local cluster of
its own (scripts/local-cluster with DSL_CLUSTER_NAME=NAME, made anew and taken down at the end;
see scripts/chaos_cluster.py), 1 rank a node (``--slots 2`` for two), with ssh or pdsh, ``--min_nodes 2``, and three more faults: an
agent's SIGKILL, a cut link, sshd stopped before a restart; a leftover is then any process of the
round on this machine or any process inside a node but its sshd.
``python scripts/chaos.py --worker DIR`` is one rank of the job.
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

import chaos_cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, SAVE_EVERY = 12, 3
BATCH = int(os.environ.get("CHAOS_BATCH", "8"))   # the global batch (12 on the cluster: 3 and 2 ranks divide it)
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


def inject(kind: str, proc: subprocess.Popen, tag: str, directory: str, rng: random.Random, cluster=None) -> str:
    """Wait for a random moment of the running job, then do the fault; returns what was done."""
    ranks = 2 if cluster is None else chaos_cluster.NODES * cluster.slots
    deadline = time.monotonic() + HANG_S / 2
    while time.monotonic() < deadline and proc.poll() is None and len(rank_pids(tag, proc.pid)) < ranks:
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
        return "nothing: the job had ended"
    if kind in chaos_cluster.KINDS:
        return chaos_cluster.inject(kind, cluster, rank_pids(tag, proc.pid), rng)
    if kind in ("kill_rank", "kill_in_checkpoint"):
        pids = rank_pids(tag, proc.pid)
        if pids:
            victim = rng.choice(pids)
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                return f"rank pid {victim} had ended"
            return f"SIGKILL rank pid {victim}"
    elif kind == "kill_dslaunch":
        proc.send_signal(signal.SIGKILL)
    elif kind == "term_dslaunch":
        proc.send_signal(signal.SIGTERM)
    elif kind == "int_dslaunch":
        proc.send_signal(signal.SIGINT)
    return kind


def run_round(number: int, kind: str, rng: random.Random, want, python: str, cluster=None) -> dict:
    import torch

    directory = tempfile.mkdtemp(prefix=f"dslaunch-chaos-{number}-")
    tag = f"{os.getpid()}-{number}"
    env = {**os.environ, "DSLAUNCH_CHAOS": tag, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    env.pop("DSLAUNCH_DEBUG", None)
    rank_env = {}
    if kind == "stuck_rank":
        rank_env["CHAOS_STUCK_AT"] = str(rng.randrange(1, STEPS))
    if cluster is None:
        env.update(rank_env)
        argv = [python, "-m", "launcher", "--num_gpus", "2", "--master_port", "0", "--no_local_rank",
                "--max_restarts", "2", "--stall_timeout", "6"]
        launcher = "local"
    else:
        launcher = rng.choice(cluster.launchers)
        argv = cluster.argv(python, tag, launcher, rank_env)
    argv += [os.path.abspath(__file__), "--worker", directory]
    disk = None
    if kind == "full_disk":   # room for one to three of the job's four checkpoints (about 60 KiB each)
        kib = rng.randrange(70, 200)
        if cluster is None:
            disk = os.path.join(directory, "ckpt")
            os.makedirs(disk)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", disk], check=True)
        else:
            disk = cluster.full_disk(directory, kib)
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = "nothing"
    if kind not in ("none", "stuck_rank"):
        done = inject(kind, proc, tag, directory, rng, cluster)
    hang = False
    try:
        output, _ = proc.communicate(timeout=max(1.0, HANG_S - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        hang = True
        proc.kill()
        output, _ = proc.communicate()
    code = 128 - proc.returncode if proc.returncode < 0 else proc.returncode
    restored = cluster.restore() if cluster is not None else None
    left = _leftovers(tag, cluster)
    for _ in range(150):   # a process that is ending gets 15 s (a node just healed answers late)
        if not left:
            break
        time.sleep(0.1)
        left = _leftovers(tag, cluster)
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
        if cluster is None:
            subprocess.run(["umount", "-l", disk], check=False)
    shutil.rmtree(directory, ignore_errors=True)
    ok = not hang and not left and code == EXPECTED[kind] and not wrong and (finished or EXPECTED[kind] != 0)
    if not ok or restored:
        print(f"round {number} ({kind}, {launcher}: {done}) {'failed' if not ok else 'passed'}: exit {code} "
              f"(expected {EXPECTED[kind]}), hang={hang}, orphans={len(left)}, wrong weights={wrong}, "
              f"finished={finished}{'; ' + restored if restored else ''}"
              + "".join(f"\n  left: {pid} {what}" for pid, what in left.items())
              + "\nlast output:\n" + "\n".join(output.splitlines()[-25:]), flush=True)
    return {"kind": kind, "ok": ok, "orphans": len(left), "hang": hang, "wrong": wrong, "code_ok": code == EXPECTED[kind],
            "what": f"{launcher}: {done}, exit {code}"}


def _leftovers(tag: str, cluster) -> dict[int, str]:
    """pid -> what, for every process of the round still there (and, on a cluster, every process
    inside a node but its sshd)."""
    found = {pid: f"DSLAUNCH_CHAOS={tag}: {' '.join(env.get('RANK', '-').split())}"
             for pid, env in processes_of(tag).items() if pid != os.getpid()}
    if cluster is not None:
        found.update(cluster.leftovers())
    return found


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
    parser.add_argument("--kinds", help="comma-separated fault kinds to draw from (default: every kind there is)")
    parser.add_argument("--cluster", metavar="NAME", help="run on a local cluster of this name (root; made anew)")
    parser.add_argument("--launcher", default="ssh,pdsh", help="on the cluster: the runner(s) each round draws from")
    parser.add_argument("--slots", type=int, choices=chaos_cluster.SLOTS, default=1,
                        help="on the cluster: ranks a node (1: a stuck rank is alone on its node)")
    parser.add_argument("--table", metavar="PATH", help="rewrite the table here after every round")
    parser.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    global BATCH
    cluster = None
    if args.cluster:
        EXPECTED.update(chaos_cluster.KINDS)
        BATCH = chaos_cluster.BATCH
        os.environ["CHAOS_BATCH"] = str(BATCH)
        cluster = chaos_cluster.ChaosCluster(args.cluster, args.launcher.split(","), args.slots)
    kinds = args.kinds.split(",") if args.kinds else [k for k in EXPECTED if k != "none"]
    if os.geteuid() != 0 and "full_disk" in kinds:
        kinds.remove("full_disk")   # a tmpfs needs root
    unknown = [k for k in kinds if k not in EXPECTED]
    if unknown:
        parser.error(f"unknown fault kind(s) {unknown}; known: {', '.join(EXPECTED)}")
    rng = random.Random(args.seed)
    want = reference()
    results = []
    if cluster is not None:
        cluster.up()
    try:
        for number in range(args.rounds):
            kind = kinds[number % len(kinds)] if number < len(kinds) else rng.choice(kinds)
            began = time.monotonic()
            results.append(run_round(number, kind, rng, want, sys.executable, cluster))
            print(f"round {number}: {kind}: {'passed' if results[-1]['ok'] else 'FAILED'} "
                  f"({results[-1]['what']}; {time.monotonic() - began:.0f} s)", flush=True)
            if args.table:
                with open(args.table, "w", encoding="utf-8") as handle:
                    handle.write(f"{len(results)} of {args.rounds} rounds (seed {args.seed})\n{table(results)}\n")
    finally:
        if cluster is not None:
            cluster.down()
    print(table(results))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

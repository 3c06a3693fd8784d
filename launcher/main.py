"""What `dslaunch` does once its flags are parsed: plan, then dry-run, check or launch."""
from __future__ import annotations

import json
import os
import sys

from launcher import console
from launcher.errors import UsageError
from launcher.hostfile import Host, load_hostfile
from launcher.machine import read_machine
from launcher.plan import JobPlan, LaunchOptions, build_plan
from launcher.planjson import plan_to_json
from launcher.runners import ControlEndpoint, get_runner

_OPTION_FIELDS = set(LaunchOptions.__dataclass_fields__)


def options_from_flags(flags: dict) -> LaunchOptions:
    values = {k: v for k, v in flags.items() if k in _OPTION_FIELDS}
    values["script"] = flags.get("script") or ""
    values["script_args"] = tuple(flags.get("script_args") or ())
    values["env"] = tuple(flags.get("env") or ())
    if values.get("launcher"):
        values["launcher"] = values["launcher"].lower()
    return LaunchOptions(**values)


def run(flags: dict) -> int:
    options = options_from_flags(flags)
    if flags.get("as_json") and not (flags.get("dry_run") or flags.get("check")):
        raise UsageError("--json goes with --dry-run or --check")
    if not options.script and not flags.get("check"):
        raise UsageError("missing SCRIPT: what should every rank run?", hint="dslaunch [OPTIONS] train.py [ARGS]")
    machine = read_machine()
    hosts, _path = load_hostfile(options.hostfile)
    if hosts is None and options.launcher == "slurm":
        hosts = slurm_hosts(machine.environ, options.num_gpus)
    plan = build_plan(hosts, options, machine)
    if options.script:
        _check_script(options, plan)
    if options.config:
        _check_config(options, plan)
    if flags.get("check"):
        from launcher.checkcmd import run_check
        return run_check(plan, hosts, options, as_json=flags.get("as_json", False))
    runner = get_runner(plan.launcher)
    if flags.get("dry_run"):
        commands = runner.render(plan, ControlEndpoint())
        if flags.get("as_json"):
            print(json.dumps(plan_to_json(plan, commands), indent=2))
        else:
            print(describe_plan(plan, commands))
        return 0
    for note in plan.notes:
        console.say(note)
    # unless --no-preflight, the agents check their nodes before any rank starts (controller.py)
    return runner.launch(plan)


def slurm_hosts(environ: dict[str, str], num_gpus: int | None) -> list[Host]:
    """No hostfile under --launcher slurm: the allocation's nodes, in its order."""
    from launcher.runners.slurm import allocation_slots, expand_hostlist
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise UsageError("--launcher slurm without a hostfile needs a Slurm allocation (SLURM_JOB_NODELIST)",
                         hint="run inside salloc/sbatch, or give --hostfile")
    names = expand_hostlist(nodelist)
    per_node = [num_gpus] * len(names) if num_gpus else allocation_slots(environ, len(names))
    return [Host(name, slots) for name, slots in zip(names, per_node)]


def _check_script(options: LaunchOptions, plan: JobPlan) -> None:
    if options.module:
        return
    path = options.script if os.path.isabs(options.script) else os.path.join(plan.workdir, options.script)
    if options.no_python:
        import shutil
        if os.path.exists(path) or shutil.which(options.script):
            return
        raise UsageError(f"program '{options.script}' not found", hint="give a path or a command on PATH")
    if not os.path.isfile(path):
        raise UsageError(f"script '{options.script}' not found in {plan.workdir}",
                         hint="check the path; with -m/--module give a module name")


def _check_config(options: LaunchOptions, plan: JobPlan) -> None:
    path = options.config if os.path.isabs(options.config) else os.path.join(plan.workdir, options.config)
    if not os.path.isfile(path):
        raise UsageError(f"config '{options.config}' not found")
    from launcher.zero.config import load_config  # torch-free by design
    load_config(path, world_size=plan.world_size)


def describe_plan(plan: JobPlan, commands: list[list[str]]) -> str:
    """The human-readable dry-run: nodes, ranks, commands, env."""
    import shlex
    lines = [f"dslaunch plan: {len(plan.nodes)} node(s), world_size {plan.world_size}, launcher {plan.launcher}, "
             f"master {plan.master_addr}:{plan.master_port or '<free port on node 0>'}",
             f"workdir: {plan.workdir}"]
    lines += [f"note: {n}" for n in plan.notes]
    if plan.env_files:
        lines.append("env files: " + ", ".join(plan.env_files))
    for node, command in zip(plan.nodes, commands):
        slots = ",".join(str(s) for s in node.slots)
        lines.append(f"node {node.node_rank}: {node.host} slots {slots} "
                     f"ranks {node.ranks[0].rank}-{node.ranks[-1].rank}")
        if command:
            lines.append(f"  command: {shlex.join(command)}")
        for rank in node.ranks:
            lines.append(f"  rank {rank.rank} (local {rank.local_rank}): {shlex.join(rank.argv)}")
    first = plan.nodes[0].ranks[0].env
    per_rank = {"RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "CROSS_RANK", "CUDA_VISIBLE_DEVICES",
                "LOCAL_WORLD_SIZE", "LOCAL_SIZE"}
    lines.append("env (rank 0; per rank: " + ", ".join(sorted(per_rank)) + "):")
    lines += [f"  {k}={v}" for k, v in first.items()]
    lines.append("set on each node unless already set: GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME "
                 "(the interface toward MASTER_ADDR), OMP_NUM_THREADS (cores / local ranks)")
    return "\n".join(lines)

"""The launch plan as data: hosts + options -> nodes -> ranks, each with argv and env.

Pure: everything read from the machine arrives in a `Machine` record, so the
planner is table-testable and `--dry-run` shows exactly what a launch would do.
"""
from __future__ import annotations

import math
import os
import shlex
from dataclasses import dataclass, field
from typing import Callable

from launcher.errors import FilterError, UsageError
from launcher.output_modes import MODES as OUTPUT_MODES
from launcher.planning import envpolicy
from launcher.planning.filters import apply_counts, apply_include_exclude
from launcher.planning.hostfile import MAX_SLOTS, Host

LAUNCHERS = ("local", "ssh", "pdsh", "openmpi", "slurm")
DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class LaunchOptions:
    """What the user asked for on the command line."""

    script: str
    script_args: tuple[str, ...] = ()
    hostfile: str | None = None
    include: str | None = None
    exclude: str | None = None
    num_nodes: int | None = None
    num_gpus: int | None = None
    master_addr: str | None = None
    master_port: int = DEFAULT_MASTER_PORT
    launcher: str | None = None
    launcher_args: str = ""
    ssh_port: int | None = None
    env: tuple[str, ...] = ()
    module: bool = False
    no_python: bool = False
    no_local_rank: bool = False
    as_deepspeed: bool = False      # ranks run the script with `import deepspeed` = launcher.zero
    log_dir: str | None = None
    bind_cores_to_rank: bool = False  # each rank gets an even share of its node's cores
    this_machine_only: bool = False   # --standalone: no hostfile, not even the default one
    config: str | None = None
    remote_python: str | None = None
    workdir: str | None = None
    heartbeat_timeout: float = 10.0
    stall_timeout: float | None = None  # a rank without progress this long while its peers go on is stuck
    no_preflight: bool = False
    force_multi: bool = False       # DeepSpeed's: start agents (ssh/pdsh) even for this machine alone
    max_restarts: int = 0           # whole-job restarts after a failure (control/restarts.py)
    min_nodes: int | None = None    # with restarts: drop a lost node while this many remain
    output: str = "all"             # which rank lines the console shows (launcher/output_modes.py)
    standby_hosts: str | None = None  # with restarts: a hostfile of spares for lost nodes


@dataclass(frozen=True)
class Machine:
    """Facts about the launching machine, read once at the edge."""

    python: str
    cwd: str
    environ: dict[str, str]
    gpu_ids: tuple[int, ...] = ()
    local_names: frozenset[str] = frozenset({"localhost", "127.0.0.1", "::1"})
    pdsh_available: bool = False
    env_files: dict[str, str] = field(default_factory=dict)
    env_files_used: tuple[str, ...] = ()
    resolve: Callable[[str], str] = lambda host: host


@dataclass(frozen=True)
class RankPlan:
    rank: int
    local_rank: int
    argv: tuple[str, ...]
    env: dict[str, str]


@dataclass(frozen=True)
class NodePlan:
    host: str
    ssh_target: str
    ssh_port: int | None
    node_rank: int
    slots: tuple[int, ...]
    is_local: bool
    ranks: tuple[RankPlan, ...]


@dataclass(frozen=True)
class JobPlan:
    world_size: int
    master_addr: str
    master_port: int
    launcher: str
    workdir: str
    python: str
    nodes: tuple[NodePlan, ...]
    launcher_args: str = ""
    log_dir: str | None = None
    heartbeat_timeout: float = 10.0
    env_files: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    preflight: bool = False  # agents check their nodes before any rank starts (multi-node)
    bind_cores: bool = False  # --bind_cores_to_rank: the agents split their node's cores by local rank
    output: str = "all"       # --output: all, rank0, failures, none (launcher/output_modes.py)
    stall_timeout: float | None = None   # --stall_timeout: the node supervisors watch the ranks' progress


def build_plan(hosts: list[Host] | None, options: LaunchOptions, machine: Machine) -> JobPlan:
    """The whole job: which slots, which rank numbers, what each rank runs and sees."""
    _check_options(options)
    notes: list[str] = []
    from_hostfile = hosts is not None
    if hosts is None:
        hosts, local_notes = _local_hosts(options, machine)
        notes += local_notes
    pool = {h.name: _slot_ids(h, hosts, machine) for h in hosts}
    resources = apply_include_exclude(pool, options.include, options.exclude, from_hostfile)
    resources = apply_counts(resources, options.num_nodes, options.num_gpus)
    by_name = {h.name: h for h in hosts}
    chosen = [by_name[name] for name in resources]
    all_local = all(h.name in machine.local_names for h in chosen)
    launcher = _choose_launcher(options, chosen, all_local, machine)
    master_addr = options.master_addr or ("127.0.0.1" if all_local else machine.resolve(chosen[0].name))
    world_size = sum(len(s) for s in resources.values())
    workdir = options.workdir or machine.cwd
    remote_python = options.remote_python or machine.python
    shared = _shared_env(options, machine)
    nodes = []
    next_rank = 0
    for node_rank, host in enumerate(chosen):
        is_local = launcher == "local"
        python = machine.python if is_local else remote_python
        base = dict(shared) if is_local else {**envpolicy.forwarded(machine.environ), **shared}
        if not is_local:
            base["PYTHONPATH"] = _join_path(workdir, base.get("PYTHONPATH"))
        slots = tuple(resources[host.name])
        ranks = []
        for local_rank, _slot in enumerate(slots):
            rank_env = dict(base)
            rank_env.update(_rank_env(next_rank, local_rank, node_rank, len(slots), world_size,
                                      len(chosen), master_addr, options.master_port, slots))
            ranks.append(RankPlan(rank=next_rank, local_rank=local_rank,
                                  argv=tuple(_rank_argv(options, python, local_rank)), env=rank_env))
            next_rank += 1
        nodes.append(NodePlan(host=host.name, ssh_target=host.ssh_target,
                              ssh_port=host.port or options.ssh_port, node_rank=node_rank, slots=slots,
                              is_local=host.name in machine.local_names, ranks=tuple(ranks)))
    return JobPlan(world_size=world_size, master_addr=master_addr, master_port=options.master_port,
                   launcher=launcher, workdir=workdir, python=remote_python if launcher != "local"
                   else machine.python, nodes=tuple(nodes), launcher_args=options.launcher_args,
                   log_dir=options.log_dir, heartbeat_timeout=options.heartbeat_timeout,
                   env_files=machine.env_files_used, notes=tuple(notes),
                   preflight=launcher != "local" and not options.no_preflight,
                   bind_cores=options.bind_cores_to_rank, output=options.output,
                   stall_timeout=options.stall_timeout)


def _check_options(options: LaunchOptions) -> None:
    if options.module and options.no_python:
        raise UsageError("--module and --no_python cannot be used together",
                         hint="--module runs 'python -m SCRIPT'; --no_python runs SCRIPT as a program")
    if options.as_deepspeed and options.no_python:
        raise UsageError("--as-deepspeed and --no_python cannot be used together",
                         hint="--as-deepspeed runs a Python script with `import deepspeed` served by dslaunch")
    if (options.include or options.exclude) and (options.num_nodes is not None or options.num_gpus is not None):
        raise FilterError("--num_nodes/--num_gpus cannot be combined with --include/--exclude",
                          hint="say which slots with --include alone, e.g. -i worker-0:0,1@worker-1")
    if options.launcher is not None and options.launcher not in LAUNCHERS:
        raise UsageError(f"unknown launcher '{options.launcher}'", hint="choose one of: " + ", ".join(LAUNCHERS))
    if not 0 <= options.master_port < 65536:
        raise UsageError(f"--master_port {options.master_port} is not a port", hint="use 1-65535, or 0 for a free one")
    # nan compares false with everything and inf never elapses: both would pass a '<= 0' check
    if not (math.isfinite(options.heartbeat_timeout) and options.heartbeat_timeout > 0):
        raise UsageError(f"--heartbeat_timeout must be a number of seconds > 0 (got {options.heartbeat_timeout:g})",
                         hint="the default is 10")
    if options.stall_timeout is not None and not (math.isfinite(options.stall_timeout) and options.stall_timeout > 0):
        raise UsageError(f"--stall_timeout must be a number of seconds > 0 (got {options.stall_timeout:g})",
                         hint="leave it out to turn the stall watch off")
    if options.ssh_port is not None and not 0 < options.ssh_port < 65536:
        raise UsageError(f"--ssh_port {options.ssh_port} is not a port", hint="use 1-65535")
    try:
        shlex.split(options.launcher_args)   # what pdsh, openmpi and slurm do with it
    except ValueError as error:
        raise UsageError(f"--launcher_args '{options.launcher_args}': {error}",
                         hint="quote it as a shell would: --launcher_args \"-x 'a b'\"") from None
    if options.output not in OUTPUT_MODES:
        raise UsageError(f"unknown --output mode '{options.output}'", hint="choose one of: " + ", ".join(OUTPUT_MODES))


def _local_hosts(options: LaunchOptions, machine: Machine) -> tuple[list[Host], list[str]]:
    """No hostfile: this machine, with its GPUs, or CPU ranks when it has none."""
    if machine.gpu_ids:
        return [Host("localhost", len(machine.gpu_ids))], []
    count = options.num_gpus or 1
    if count > MAX_SLOTS:
        raise FilterError(f"--num_gpus {count}: more than {MAX_SLOTS} CPU ranks on this machine",
                          hint="this machine has no GPU; ask for as many CPU ranks as it has cores")
    note = f"no GPU found: starting {count} CPU rank(s), which talk over gloo"
    return [Host("localhost", count)], [note]


def _slot_ids(host: Host, hosts: list[Host], machine: Machine) -> list[int]:
    if len(hosts) == 1 and host.name == "localhost" and machine.gpu_ids and host.slots == len(machine.gpu_ids):
        return list(machine.gpu_ids)
    return list(range(host.slots))


def _choose_launcher(options: LaunchOptions, hosts: list[Host], all_local: bool, machine: Machine) -> str:
    if options.launcher:
        if options.launcher == "local" and not all_local:
            remote = [h.name for h in hosts if h.name not in machine.local_names]
            raise UsageError(f"--launcher local cannot start ranks on other hosts: {', '.join(remote)}",
                             hint="use --launcher ssh or pdsh, or --include only this machine")
        return options.launcher
    if all_local and not options.force_multi:
        return "local"
    return "pdsh" if machine.pdsh_available else "ssh"


def _shared_env(options: LaunchOptions, machine: Machine) -> dict[str, str]:
    shared = dict(machine.env_files)
    shared.update(envpolicy.parse_env_options(options.env))
    if options.config:
        shared["DSLAUNCH_CONFIG"] = os.path.join(options.workdir or machine.cwd, options.config)
    return shared


def _rank_env(rank, local_rank, node_rank, local_world_size, world_size, num_nodes,
              master_addr, master_port, slots) -> dict[str, str]:
    values = {
        "RANK": rank, "LOCAL_RANK": local_rank, "WORLD_SIZE": world_size,
        "LOCAL_WORLD_SIZE": local_world_size, "LOCAL_SIZE": local_world_size,
        "NODE_RANK": node_rank, "GROUP_RANK": node_rank, "CROSS_RANK": node_rank,
        "CROSS_SIZE": num_nodes, "MASTER_ADDR": master_addr, "MASTER_PORT": master_port,
        "CUDA_VISIBLE_DEVICES": ",".join(str(s) for s in slots),
    }
    return {k: str(v) for k, v in values.items()}


def _rank_argv(options: LaunchOptions, python: str, local_rank: int) -> list[str]:
    shim = ["-m", "launcher.zero.shim"] if options.as_deepspeed else []
    if options.no_python:
        argv = [options.script]
    elif options.module:
        argv = [python, "-u", *shim, "-m", options.script]
    else:
        argv = [python, "-u", *shim, options.script]
    if not options.no_local_rank:
        argv.append(f"--local_rank={local_rank}")
    return argv + list(options.script_args)


def _join_path(first: str, rest: str | None) -> str:
    return first if not rest else f"{first}:{rest}"


def with_master_port(plan: JobPlan, port: int) -> JobPlan:
    """The same plan with MASTER_PORT replaced (after `--master_port 0` picked one)."""
    from dataclasses import replace
    nodes = []
    for node in plan.nodes:
        ranks = tuple(replace(r, env={**r.env, "MASTER_PORT": str(port)}) for r in node.ranks)
        nodes.append(replace(node, ranks=ranks))
    return replace(plan, master_port=port, nodes=tuple(nodes))

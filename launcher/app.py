"""What `dslaunch` does once its flags are parsed: plan, then dry-run, check or launch."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from launcher import console
from launcher.control.machine import read_machine
from launcher.control.runners import get_runner
from launcher.errors import ConfigError, UsageError
from launcher.planning import redact
from launcher.planning.hostfile import Host, load_hostfile
from launcher.planning.plan import JobPlan, LaunchOptions, build_plan
from launcher.planning.render import describe_plan, plan_to_json
from launcher.planning.topology import build_layout, check_tensor_groups_within_nodes, describe_layout, sizes_from_sections
from launcher.planning.restart_plan import RestartPolicy, check_standby, surviving_options, with_standbys
from launcher.wire import ControlEndpoint

_OPTION_FIELDS = set(LaunchOptions.__dataclass_fields__)


@dataclass(frozen=True)
class Mode:
    """What this invocation does besides planning: dry-run, check, JSON output, tracebacks."""

    dry_run: bool = False
    check: bool = False
    as_json: bool = False
    debug: bool = False
    show_secrets: bool = False      # print secret-looking values as they are (planning/redact.py)

    @classmethod
    def from_flags(cls, flags: dict) -> "Mode":
        return cls(dry_run=bool(flags.get("dry_run")), check=bool(flags.get("check")),
                   as_json=bool(flags.get("as_json")), debug=bool(flags.get("debug")),
                   show_secrets=bool(flags.get("show_secrets")))


def options_from_flags(flags: dict) -> LaunchOptions:
    values = {k: v for k, v in flags.items() if k in _OPTION_FIELDS}
    values["script"] = flags.get("script") or ""
    values["script_args"] = tuple(flags.get("script_args") or ())
    values["env"] = tuple(flags.get("env") or ())
    if values.get("launcher"):
        values["launcher"] = values["launcher"].lower()
    return LaunchOptions(**values)


def run(options: LaunchOptions, mode: Mode) -> int:
    if mode.as_json and not (mode.dry_run or mode.check):
        raise UsageError("--json goes with --dry-run or --check")
    if not options.script and not mode.check:
        raise UsageError("missing SCRIPT: what should every rank run?", hint="dslaunch [OPTIONS] train.py [ARGS]")
    machine = read_machine()
    hosts, _path = (None, None) if options.this_machine_only else load_hostfile(options.hostfile)
    if hosts is None and options.launcher == "slurm":
        hosts = slurm_hosts(machine.environ, options.num_gpus)
    plan = build_plan(hosts, options, machine)
    standby = _standby_hosts(options, hosts)
    policy = RestartPolicy.from_options(options, standby)
    if options.script:
        _check_script(options, plan)
    layout = _check_config(options, plan) if options.config else None
    patterns = redact.secret_patterns(machine.environ.get(redact.PATTERNS_VARIABLE))
    if not mode.show_secrets:
        console.hide_values(redact.secret_values(plan, patterns, machine.environ))
    if mode.check:
        from launcher.control.check import run_check
        return run_check(plan, hosts, options, as_json=mode.as_json)
    runner = get_runner(plan.launcher)
    if mode.dry_run:
        commands = runner.render(plan, ControlEndpoint())
        if not mode.show_secrets:
            plan = redact.redacted_plan(plan, patterns)
        host_of = {rank.rank: node.host for node in plan.nodes for rank in node.ranks}
        if mode.as_json:
            document = {**plan_to_json(plan, commands), "restarts": policy.to_json()}
            if layout is not None:
                document["topology"] = layout.to_json(host_of)
            print(json.dumps(document, indent=2))
        else:
            print(describe_plan(plan, commands) + "\n" + policy.describe(len(plan.nodes)))
            if layout is not None:
                print(describe_layout(layout, host_of))
        return 0
    for note in plan.notes:
        console.say(note)
    # unless --no-preflight, the agents check their nodes before any rank starts (control/controller.py)
    from launcher.control.launch import launch

    current, spares = hosts, list(standby)   # the hosts of the latest plan, the spares not yet taken

    def replan(previous: JobPlan, lost: set[int]) -> JobPlan:  # the same job on the survivors (and spares)
        nonlocal current, spares
        if not standby:
            return build_plan(hosts, surviving_options(previous, options, lost), machine)
        current, following, spares = with_standbys(previous, options, current, lost, spares)
        return build_plan(current, following, machine)
    return launch(plan, machine.environ, policy, replan)


def _standby_hosts(options: LaunchOptions, hosts: list[Host] | None) -> tuple[Host, ...]:
    if not options.standby_hosts:
        return ()
    spares, _path = load_hostfile(options.standby_hosts)
    check_standby(hosts, spares or [], options.standby_hosts)
    return tuple(spares or ())


def slurm_hosts(environ: dict[str, str], num_gpus: int | None) -> list[Host]:
    """No hostfile under --launcher slurm: the allocation's nodes, in its order."""
    from launcher.control.runners.slurm import allocation_slots, expand_hostlist
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


def _check_config(options: LaunchOptions, plan: JobPlan):
    """Validate the engine config; with pipeline/tensor sizes in it, return the job's 3D layout."""
    path = options.config if os.path.isabs(options.config) else os.path.join(plan.workdir, options.config)
    if not os.path.isfile(path):
        raise UsageError(f"config '{options.config}' not found")
    from launcher.zero.config.load import load_config  # torch-free by design
    from launcher.zero.config.checks import check_without_model
    try:
        sections = load_config(path).unsupported
        pipe, tensor = sizes_from_sections(sections.get("pipeline"), sections.get("tensor_parallel"))
        layout, data_ranks = None, plan.world_size
        if pipe != 1 or tensor != 1:
            layout = build_layout(plan.world_size, pipe, tensor, source=options.config)
            check_tensor_groups_within_nodes(layout, {r.rank: n.host for n in plan.nodes for r in n.ranks},
                                             options.config)
            data_ranks = layout.data   # the batch triplet counts data-parallel ranks
        config = load_config(path, world_size=data_ranks)
        if pipe > 1 and config.zero_stage > 1:      # the engine refuses it too (launcher/zero/assembly/initialize_pipeline.py)
            raise ConfigError(f"zero_optimization.stage {config.zero_stage} with pipeline.stages {pipe} is not "
                              "supported (pipelines run ZeRO stages 0-1 over the data axis, DeepSpeed's limit too)",
                              hint='set "zero_optimization": {"stage": 1}')
        check_without_model(config)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error.message}" if path not in error.message else error.message,
                          hint=error.hint) from None
    return layout

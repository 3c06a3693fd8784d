"""`dslaunch --check` and the fast preflight before every multi-node launch."""
from __future__ import annotations

import sys

from launcher import console
from launcher.errors import EXIT_PREFLIGHT, PreflightError, UsageError
from launcher.planning.hostfile import Host
from launcher.planning.plan import JobPlan, LaunchOptions


def _request(plan: JobPlan, options: LaunchOptions, fast: bool):
    from launcher.preflight import PreflightRequest
    script = None
    if options.script and not options.module and not options.no_python:
        script = options.script
    return PreflightRequest(ssh_port=options.ssh_port, remote_python=plan.python, workdir=plan.workdir,
                            script=script, master_addr=plan.master_addr, master_port=plan.master_port,
                            launcher=plan.launcher, fast=fast, env=dict(plan.nodes[0].ranks[0].env))


def _plan_hosts(plan: JobPlan, hosts: list[Host] | None) -> list[Host]:
    by_name = {h.name: h for h in hosts or []}
    return [by_name.get(n.host, Host(n.host, len(n.slots))) for n in plan.nodes]


def run_check(plan: JobPlan, hosts: list[Host] | None, options: LaunchOptions, as_json: bool) -> int:
    """Every check on every host of the plan; exit 0 when all pass, 3 otherwise."""
    if plan.launcher == "local":
        raise UsageError("--check needs a hostfile with other hosts: this job runs on this machine only",
                         hint="dslaunch --hostfile HOSTS --check")
    from launcher.preflight import run_preflight
    report = run_preflight(_plan_hosts(plan, hosts), _request(plan, options, fast=False))
    print(console.scrub(report.to_json(indent=2) if as_json else report.format_table()))
    return 0 if report.ok else EXIT_PREFLIGHT


# where these fail the agent cannot start at all, so skipping the checks would not help
_AGENT_CANNOT_START = ("ssh", "pdsh", "python", "dslaunch")


def preflight_failed(report) -> None:
    """Show the failed checks (once: the table) and stop the launch (exit 3); nothing has started."""
    print(console.scrub(report.format_table()), file=sys.stderr)
    failed = {check.name for host in report.failed_hosts for check in host.checks if not check.ok}
    if failed & set(_AGENT_CANNOT_START):
        hint = "fix what the table says (--no-preflight would not help: dslaunch cannot start its agent there)"
    else:
        hint = "fix what the table says, or skip the checks with --no-preflight"
    raise PreflightError("nothing was started on any node", hint=hint)

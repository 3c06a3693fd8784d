"""Run every rank of a local plan on this machine, supervised in-process (no agent, no ssh)."""
from __future__ import annotations

import os
import signal

from launcher import console
from launcher.control.outcome import Outcome
from launcher.errors import EXIT_SIGINT
from launcher.node.process import RankOutput
from launcher.node.ranks import rank_specs
from launcher.output_modes import OutputFilter
from launcher.node.supervisor import NodeHooks, NodeSettings, Supervisor
from launcher.planning.plan import JobPlan, with_master_port
from launcher.wire import free_port


def run_local_try(plan: JobPlan, environ: dict[str, str], grace: float = 3.0) -> Outcome:
    """One try of a local job, its end as an Outcome (control/restarts.py restarts it)."""
    if plan.master_port == 0:   # --master_port 0 / --standalone: a free port here (the agents do it elsewhere)
        plan = with_master_port(plan, free_port("127.0.0.1"))
    specs = []
    for node in plan.nodes:  # several "nodes" here only when a hostfile names this machine twice
        specs += rank_specs(node.ranks, plan.master_addr, plan.workdir, dict(environ),
                            cores=sorted(os.sched_getaffinity(0)) if plan.bind_cores else ())
    relay = OutputFilter(plan.output)

    def on_output(event) -> None:
        if relay.shows(event.rank):
            console.print_rank_line(event)

    def on_exit(done) -> None:
        if done.stuck_pid is not None:
            console.say(done.describe())
        tail = relay.tail_to_print(done.rank, done.returncode, done.tail)
        if tail:
            console.say(f"rank {done.rank} failed; its last {len(tail)} lines (held by --output failures):")
            for line in tail:
                console.print_rank_line(RankOutput(done.rank, "stderr", line))
    supervisor = Supervisor(specs, NodeHooks(on_output=on_output, on_exit=on_exit, on_stall=console.say),
                            NodeSettings(log_dir=plan.log_dir, grace=grace, host=plan.nodes[0].host,
                                         stall_timeout=plan.stall_timeout))
    handlers = _install_signal_handlers(supervisor)
    try:
        supervisor.start()
        result = supervisor.run()
    finally:
        for signum, previous in handlers.items():
            signal.signal(signum, previous)
    code = finish(result)
    closing = relay.summary(plan.log_dir)
    if closing:
        console.say(closing)
    return Outcome(code, result.first_failure, interrupted=result.stopped_by)


def finish(result) -> int:
    if result.first_failure is not None:
        console.say(console.failure_summary(result.first_failure, exits=result.exits))
        return result.first_failure.exit_code
    if result.stopped_by is not None:
        console.say(f"stopped by {result.stopped_by}; every rank was stopped")
        return EXIT_SIGINT if result.stopped_by == "SIGINT" else 128 + signal.SIGTERM
    return 0


def _install_signal_handlers(supervisor: Supervisor) -> dict:
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        name = signal.Signals(signum).name

        def handler(_signum, _frame, name=name, signum=signum):
            supervisor.request_stop(name, signum)
        previous[signum] = signal.signal(signum, handler)
    return previous

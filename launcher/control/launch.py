"""Start a plan: local ranks in-process, every other launcher's commands under the controller.

The runners only render (a plan and the control endpoint in, argv lists out); this is where
their commands become processes: one per node (ssh, ``PER_NODE``) or one for all nodes (pdsh,
mpirun, srun), with the runner's environment when it has one (``runner_env``).
"""
from __future__ import annotations

import resource
from typing import Callable

from launcher.control.controller import Controller, Started, spawn_runner
from launcher.control.fanout import FDS_PER_NODE, soft_limit_for
from launcher.control.outcome import NodesUnusable, Outcome
from launcher.control.restarts import run_with_restarts
from launcher.control.runners import get_runner
from launcher.errors import EXIT_PREFLIGHT
from launcher.planning.plan import JobPlan
from launcher.planning.restart_plan import RestartPolicy
from launcher.wire import ControlEndpoint


def launch(plan: JobPlan, environ: dict[str, str], policy: RestartPolicy = RestartPolicy(),
           replan: Callable[[JobPlan, set[int]], JobPlan] | None = None) -> int:
    """Run the job to its end, restarting it as `policy` allows; the exit code is the last try's
    first failure's (0 when every rank succeeded).

    ``environ`` is this machine's environment as the machine facts read it (once, at start);
    ``replan(plan, lost_node_ranks)`` is the plan on the survivors (needed with --min_nodes).
    """
    def no_replan(_plan: JobPlan, _lost: set[int]) -> JobPlan:
        raise AssertionError("a node was lost but no replan was given")  # pragma: no cover
    return run_with_restarts(plan, policy, lambda p, drop: launch_try(p, environ, drop), replan or no_replan)


def launch_try(plan: JobPlan, environ: dict[str, str], drop_unusable: bool = False) -> Outcome:
    """One try of the job: every node started, supervised, torn down.

    With `drop_unusable` (a restart that may shrink) nodes whose agent cannot start or whose
    preflight fails come back as the outcome's `unreachable` instead of ending the job (exit 3)."""
    if plan.launcher == "local":
        from launcher.control.local_job import run_local_try

        return run_local_try(plan, environ)
    runner = get_runner(plan.launcher)
    environ = dict(environ)
    env = runner.runner_env(plan, environ) if hasattr(runner, "runner_env") else environ

    per_node = runner.PER_NODE
    _ensure_fd_limit(len(plan.nodes), FDS_PER_NODE if per_node else 2)
    controller = Controller(plan, delivery=runner.SECRET_DELIVERY, drop_unusable=drop_unusable)
    credentials = controller.credentials

    def start(endpoint: ControlEndpoint) -> list[Started]:
        commands = runner.render(plan, endpoint)
        if per_node:  # ssh: each node's key on its own connection's stdin
            return [spawn_runner(f"{runner.LABEL} {node.host}", argv, env, (node.node_rank,),
                                 stdin_data=credentials.stdin_for(node.node_rank))
                    for node, argv in zip(plan.nodes, commands)]
        return [spawn_runner(runner.LABEL, commands[0], {**env, **credentials.runner_env()},
                             tuple(n.node_rank for n in plan.nodes))]
    try:
        code = controller.run(start)
    except NodesUnusable as unusable:
        return Outcome(EXIT_PREFLIGHT, unreachable=unusable.troubles)
    return controller.outcome or Outcome(code)


def _ensure_fd_limit(node_count: int, per_node: int) -> None:
    """Raise the soft fd limit as far as this job needs (or fail before anything starts)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    finite = lambda limit: -1 if limit == resource.RLIM_INFINITY else limit  # noqa: E731
    wanted = soft_limit_for(node_count, finite(soft), finite(hard), per_node)
    if wanted != finite(soft):
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))

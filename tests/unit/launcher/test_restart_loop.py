"""The restart loop driven by scripted tries: lost agents, nodes unreachable at a restart, the summary."""
from launcher.control import unusable
from launcher.control.outcome import NodeTrouble, Outcome
from launcher.control.restarts import run_with_restarts
from launcher.node.process import RankExit
from launcher.planning.hostfile import parse_hostfile
from launcher.planning.plan import LaunchOptions, Machine, build_plan
from launcher.planning.restart_plan import RestartPolicy, surviving_options
from launcher.preflight.report import Check, HostReport, PreflightReport

HOSTS = parse_hostfile("n1 slots=2\nn2 slots=2\nn3 slots=2\n", "hosts")
MACHINE = Machine(python="/py", cwd="/work", environ={}, pdsh_available=True,
                  resolve=lambda h: {"n1": "10.0.0.1", "n2": "10.0.0.2", "n3": "10.0.0.3"}[h])
OPTIONS = LaunchOptions(script="train.py")
PLAN = build_plan(HOSTS, OPTIONS, MACHINE)


def replan(plan, lost):
    return build_plan(HOSTS, surviving_options(plan, OPTIONS, lost), MACHINE)


class Tries:
    """run_try that plays back `outcomes`, remembering what each try was given."""

    def __init__(self, *outcomes):
        self.outcomes = list(outcomes)
        self.seen = []   # (hosts, restart count, drop_unusable) per try

    def __call__(self, plan, drop_unusable):
        count = plan.nodes[0].ranks[0].env["DSLAUNCH_RESTART_COUNT"]
        self.seen.append(([n.host for n in plan.nodes], count, drop_unusable))
        return self.outcomes.pop(0)


def run(policy, tries):
    return run_with_restarts(PLAN, policy, tries, replan, pause_s=0.0)


def said(capsys):
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("dslaunch: ")]


DIED = Outcome(75, lost=(2,), lost_hosts=("n3",), lost_reasons=("agent died",))
RANK_FAILED = Outcome(3, RankExit(4, 0, 3, ("boom",), "n3"))


def test_a_node_whose_agent_died_is_dropped_and_the_summary_names_it(capsys):
    tries = Tries(DIED, Outcome(0))
    assert run(RestartPolicy(1, min_nodes=2), tries) == 0
    assert [hosts for hosts, _, _ in tries.seen] == [["n1", "n2", "n3"], ["n1", "n2"]]
    lines = said(capsys)
    assert "restart 1/1: node 2 (n3) lost (agent died); restarting on the 2 remaining node(s)" in lines[0]
    assert lines[-1] == "dslaunch: 1 of 1 restart(s) used; node(s) lost: n3 (agent died, try 0)"


def test_a_node_unreachable_at_the_restart_is_dropped_without_using_a_restart(capsys):
    unreachable = Outcome(3, unreachable=(NodeTrouble(2, "n3", "ssh: connection refused"),))
    tries = Tries(RANK_FAILED, unreachable, Outcome(0))
    assert run(RestartPolicy(1, min_nodes=2), tries) == 0
    assert tries.seen == [(["n1", "n2", "n3"], "0", False), (["n1", "n2", "n3"], "1", True),
                          (["n1", "n2"], "1", True)]
    lines = said(capsys)
    assert lines[1].startswith("dslaunch: unreachable at restart: n3 (ssh: connection refused); "
                               "restarting on the 2 remaining node(s), world size 4")
    assert lines[1].endswith("(no restart used)")
    assert lines[-1] == ("dslaunch: 1 of 1 restart(s) used; node(s) lost: "
                         "n3 (unreachable, ssh: connection refused, try 1)")


def test_without_min_nodes_a_restart_does_not_drop_nodes():
    tries = Tries(RANK_FAILED, RANK_FAILED)
    assert run(RestartPolicy(1), tries) == 3
    assert [drop for _, _, drop in tries.seen] == [False, False]


def test_too_few_reachable_nodes_at_the_restart_end_the_job_with_exit_3(capsys):
    unreachable = Outcome(3, unreachable=(NodeTrouble(1, "n2", "ssh: timed out"), NodeTrouble(2, "n3", "ssh: refused")))
    assert run(RestartPolicy(2, min_nodes=2), Tries(RANK_FAILED, unreachable)) == 3
    lines = said(capsys)
    assert "unreachable at restart: n2 (ssh: timed out), n3 (ssh: refused); not restarting: 1 node(s) left" in lines[-2]
    assert lines[-1].startswith("dslaunch: 1 of 2 restart(s) used; node(s) lost: n2 (unreachable")


def test_a_lost_node_without_a_reason_keeps_the_old_phrase():
    assert Outcome(75, lost=(2,), lost_hosts=("n3",)).cause() == "node 2 (n3) lost (silent or did not confirm the stop)"


def test_the_reasons_come_from_the_preflight_report_else_from_the_runner():
    report = PreflightReport((HostReport("n1", (Check("ssh", True),)),
                              HostReport("n3", (Check("ssh", False, "connection refused", "start sshd"),))))
    assert unusable.from_report(PLAN, report) == (NodeTrouble(2, "n3", "ssh: connection refused"),)
    problem = "ssh n3 exited with code 255 before the agent of node 2 (n3) connected:\n    ssh: connect to host n3: refused"
    assert unusable.at_startup(PLAN, [2], problem) == (NodeTrouble(2, "n3", "ssh: connect to host n3: refused"),)
    assert unusable.at_startup(PLAN, [2], problem, report) == (NodeTrouble(2, "n3", "ssh: connection refused"),)

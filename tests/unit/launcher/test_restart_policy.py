"""The restart policy, the re-plan on the surviving nodes, and the early stop: pure, table-driven."""
import pytest

from launcher.control.outcome import Outcome
from launcher.control.restarts import QUICK_FAILURE_S, Try, next_plan, repeats_at_once
from launcher.errors import UsageError
from launcher.node.process import RankExit
from launcher.planning.hostfile import parse_hostfile
from launcher.planning.plan import LaunchOptions, Machine, build_plan
from launcher.planning.restart_plan import RestartPolicy, surviving_options, with_restart_count

HOSTS = parse_hostfile("n1 slots=2\nn2 slots=2\nn3 slots=2\n", "hosts")
MACHINE = Machine(python="/py", cwd="/work", environ={}, pdsh_available=True,
                  resolve=lambda h: {"n1": "10.0.0.1", "n2": "10.0.0.2", "n3": "10.0.0.3"}[h])


def plan_for(**kw):
    options = LaunchOptions(script="train.py", **kw)
    return build_plan(HOSTS, options, MACHINE), options


def shrink(options, plan, lost):
    return build_plan(HOSTS, surviving_options(plan, options, lost), MACHINE)


@pytest.mark.parametrize("lost, hosts, world, master, ranks", [
    ({2}, ["n1", "n2"], 4, "10.0.0.1", [0, 1, 2, 3]),
    ({0}, ["n2", "n3"], 4, "10.0.0.2", [0, 1, 2, 3]),     # the master moves to the first survivor
    ({0, 2}, ["n2"], 2, "10.0.0.2", [0, 1]),
])
def test_a_lost_node_is_dropped_and_the_plan_recomputed(lost, hosts, world, master, ranks):
    plan, options = plan_for()
    shrunk = shrink(options, plan, lost)
    assert [n.host for n in shrunk.nodes] == hosts
    assert shrunk.world_size == world and shrunk.master_addr == master
    assert [r.rank for n in shrunk.nodes for r in n.ranks] == ranks
    assert {r.env["WORLD_SIZE"] for n in shrunk.nodes for r in n.ranks} == {str(world)}
    assert {r.env["MASTER_ADDR"] for n in shrunk.nodes for r in n.ranks} == {master}
    assert [n.node_rank for n in shrunk.nodes] == list(range(len(hosts)))
    assert shrunk.preflight  # the checks run again on the survivors


def test_shrinking_keeps_the_slots_first_chosen_and_drops_a_lost_given_master():
    plan, options = plan_for(include="n1:1@n2:0@n3:0,1", master_addr="n1")
    shrunk = shrink(options, plan, {0})
    assert [(n.host, n.slots) for n in shrunk.nodes] == [("n2", (0,)), ("n3", (0, 1))]
    assert shrunk.master_addr == "10.0.0.2"
    kept, options = plan_for(num_gpus=1, master_addr="10.9.9.9")
    assert shrink(options, kept, {1}).master_addr == "10.9.9.9"


def test_ranks_see_the_restart_count_under_both_names():
    plan, _ = plan_for()
    env = with_restart_count(plan, 2).nodes[2].ranks[1].env
    assert (env["DSLAUNCH_RESTART_COUNT"], env["TORCHELASTIC_RESTART_COUNT"]) == ("2", "2")
    assert "DSLAUNCH_RESTART_COUNT" not in plan.nodes[0].ranks[0].env


@pytest.mark.parametrize("max_restarts, min_nodes", [(-1, None), (1, 0)])
def test_bad_policies_are_usage_errors(max_restarts, min_nodes):
    with pytest.raises(UsageError):
        RestartPolicy.from_options(LaunchOptions(script="t.py", max_restarts=max_restarts, min_nodes=min_nodes))


def failed(rank=1, code=3, last="boom", seconds=2.0):
    return Try(Outcome(code, RankExit(rank, rank, code, ("x", last, ""), "h")), seconds)


@pytest.mark.parametrize("previous, last, repeats", [
    (None, failed(), False),
    (failed(), failed(), True),
    (failed(), failed(rank=0), False),
    (failed(), failed(code=4), False),
    (failed(), failed(last="other"), False),
    (failed(seconds=QUICK_FAILURE_S + 1), failed(), False),       # it ran a while first: not "at once"
    (failed(), failed(seconds=QUICK_FAILURE_S + 1), False),
    (failed(), Try(Outcome(1, lost=(2,), lost_hosts=("n3",)), 1.0), False),
])
def test_only_a_quick_failure_the_same_way_counts_as_a_repeat(previous, last, repeats):
    assert repeats_at_once(previous, last) is repeats


def test_next_plan_follows_min_nodes():
    plan, options = plan_for()
    replan = lambda p, lost: shrink(options, p, lost)  # noqa: E731
    lost = Outcome(1, lost=(2,), lost_hosts=("n3",))
    assert next_plan(RestartPolicy(1), plan, Outcome(3), replan)[0] is plan
    following, said = next_plan(RestartPolicy(1, min_nodes=2), plan, lost, replan)
    assert following.world_size == 4 and "2 remaining node(s), world size 4" in said
    assert next_plan(RestartPolicy(1, min_nodes=3), plan, lost, replan)[0] is None
    assert next_plan(RestartPolicy(1), plan, lost, replan)[0] is None

"""--standby_hosts: a spare takes a lost node's place at the restart (the pure plan part, the policy)."""
import json

import pytest

from launcher.control.outcome import NodeTrouble, Outcome
from launcher.control.restarts import next_plan
from launcher.errors import UsageError
from launcher.planning.hostfile import parse_hostfile
from launcher.planning.plan import LaunchOptions, Machine, build_plan
from launcher.planning.restart_plan import RestartPolicy, check_standby, with_standbys

ADDRESSES = {"n1": "10.0.0.1", "n2": "10.0.0.2", "n3": "10.0.0.3", "s1": "10.0.0.11", "s2": "10.0.0.12"}
HOSTS = parse_hostfile("n1 slots=2\nn2 slots=2\nn3 slots=2\n", "hosts")
SPARES = parse_hostfile("s1 slots=4\ns2 slots=1\n", "spares")
MACHINE = Machine(python="/py", cwd="/work", environ={}, pdsh_available=True, resolve=ADDRESSES.__getitem__)
OPTIONS = LaunchOptions(script="train.py", max_restarts=2)


def replanned(plan, lost, hosts=HOSTS, spares=SPARES, options=OPTIONS):
    hosts, following, left = with_standbys(plan, options, hosts, lost, spares)
    return build_plan(hosts, following, MACHINE), hosts, left


def test_a_spare_takes_the_lost_nodes_place_and_slot_count():
    plan = build_plan(HOSTS, OPTIONS, MACHINE)
    following, hosts, left = replanned(plan, {1})
    assert [(n.host, n.node_rank, n.slots) for n in following.nodes] == [("n1", 0, (0, 1)), ("s1", 1, (0, 1)),
                                                                        ("n3", 2, (0, 1))]
    assert following.world_size == 6 and following.master_addr == "10.0.0.1"
    assert [h.name for h in left] == ["s2"]
    # the next loss takes the next spare, which has only one slot; then none is left and the job shrinks
    second, hosts, left = replanned(following, {0}, hosts, left)
    assert [(n.host, n.slots) for n in second.nodes] == [("s2", (0,)), ("s1", (0, 1)), ("n3", (0, 1))]
    assert second.master_addr == "10.0.0.12" and second.world_size == 5 and left == []
    third, _hosts, _left = replanned(second, {2}, hosts, left)
    assert [n.host for n in third.nodes] == ["s2", "s1"] and third.world_size == 3


def test_next_plan_says_which_spare_came_in_and_needs_no_min_nodes():
    plan = build_plan(HOSTS, OPTIONS, MACHINE)
    lost = Outcome(75, lost=(2,), lost_hosts=("n3",), lost_reasons=("agent died",))
    policy = RestartPolicy(2, None, ("s1", "s2"))
    following, said = next_plan(policy, plan, lost, lambda p, dropped: replanned(p, dropped)[0])
    assert [n.host for n in following.nodes] == ["n1", "n2", "s1"]
    assert said == "restarting on 3 node(s) with standby s1, world size 6, master 10.0.0.1"
    unreachable = Outcome(3, unreachable=(NodeTrouble(0, "n1", "ssh: refused"),))
    following, said = next_plan(policy, plan, unreachable, lambda p, dropped: replanned(p, dropped)[0])
    assert following.nodes[0].host == "s1" and "master 10.0.0.11" in said
    # no spare left and no --min_nodes: the job ends as a lost node always did
    none_left, said = next_plan(policy, plan, lost, lambda p, dropped: replanned(p, dropped, spares=[])[0])
    assert none_left is None and "no standby host is left" in said


def test_the_policy_names_the_spares_in_the_dry_run():
    policy = RestartPolicy.from_options(OPTIONS, tuple(SPARES))
    assert policy.to_json() == {"max_restarts": 2, "min_nodes": None, "standby_hosts": ["s1", "s2"]}
    assert "standby host(s) s1, s2 take a lost node's place first" in policy.describe(3)
    assert "standby_hosts" not in json.loads(json.dumps(RestartPolicy(1).to_json()))


@pytest.mark.parametrize("hosts, spares, options, words", [
    (HOSTS, parse_hostfile("n2 slots=2\n", "spares"), OPTIONS, "host\\(s\\) n2 also in the hostfile"),
    (None, SPARES, OPTIONS, "needs a hostfile"),
    (HOSTS, SPARES, LaunchOptions(script="t.py"), "without --max_restarts"),
])
def test_bad_standby_hosts_are_usage_errors(hosts, spares, options, words):
    with pytest.raises(UsageError, match=words):
        check_standby(hosts, spares, "spares")
        RestartPolicy.from_options(options, tuple(spares))

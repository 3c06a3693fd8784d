"""--stall_timeout across nodes: dslaunch's one watch over every rank, fed by the agents' reports
(launcher/control/stalls.py), with the clock passed in."""
from launcher.control.stalls import JobStalls


def job(timeout=10.0, nodes=3, slots=1):
    """node k runs ranks k*slots .. k*slots+slots-1 on host node{k+1}."""
    return JobStalls(timeout, {k: (f"node{k + 1}", tuple(range(k * slots, (k + 1) * slots))) for k in range(nodes)})


def every_node_reports(stalls, slots, events, step, now, skip=()):
    for node_rank in range(len(stalls.nodes)):
        readings = [[rank, events, step] for rank in stalls.nodes[node_rank][1] if rank not in skip]
        stalls.report(node_rank, readings, now)


def test_the_only_rank_of_a_node_left_behind_is_named_with_its_host_and_step():
    stalls = job(nodes=3, slots=1)
    every_node_reports(stalls, 1, events=7, step=2, now=0.0)
    stalls.report(0, [[0, 8, 2]], now=1.0)   # ranks 0 and 2 go on into the all-reduce; rank 1 (node2) never does
    stalls.report(2, [[2, 8, 2]], now=1.5)
    assert stalls.check(now=10.4) is None   # (asked at most every CHECK_SECONDS)
    stuck = stalls.check(now=11.0)
    assert (stuck.stall.rank, stuck.node_rank, stuck.host, stuck.stall.step) == (1, 1, "node2", 2)
    assert stuck.message.startswith("rank 1 on node2 is stuck after step 2: no progress for 10 s")
    assert "whole node" not in stuck.message
    assert stalls.check(now=50.0) is None   # said once: the stacks and the stop follow


def test_a_whole_node_behind_is_named_as_such():
    stalls = job(nodes=2, slots=2)
    every_node_reports(stalls, 2, events=4, step=1, now=0.0)
    stalls.report(0, [[0, 5, 1], [1, 5, 1]], now=1.0)   # node1's ranks wait in the collective; node2's hang
    stuck = stalls.check(now=11.0)
    assert stuck.host == "node2" and stuck.stall.rank in (2, 3) and stuck.whole_node
    assert "so is every other rank on node2" in stuck.message


def test_one_rank_behind_on_a_node_of_several_is_not_a_whole_node():
    stalls = job(nodes=2, slots=2)
    every_node_reports(stalls, 2, events=4, step=1, now=0.0)
    stalls.report(0, [[0, 5, 1], [1, 5, 1]], now=1.0)
    stalls.report(1, [[3, 5, 1]], now=1.0)
    stuck = stalls.check(now=11.0)
    assert (stuck.stall.rank, stuck.host, stuck.whole_node) == (2, "node2", False)


def test_every_rank_stopped_alike_is_not_reported():
    stalls = job(nodes=4, slots=2)
    for now in range(5):
        every_node_reports(stalls, 2, events=now, step=now, now=float(now))
    assert stalls.check(now=1000.0) is None


def test_a_node_cannot_report_another_nodes_ranks():
    stalls = job(nodes=2, slots=1)
    stalls.report(1, [[1, 5, 1]], now=0.0)
    stalls.report(0, [[0, 5, 1], [1, 9, 3]], now=1.0)   # node 0 speaking for rank 1 (node 1's) is dropped
    assert stalls.check(now=100.0) is None


def test_a_restart_starts_the_watch_over():
    stalls = job(nodes=2, slots=1)
    every_node_reports(stalls, 1, events=100, step=30, now=0.0)
    stalls.report(0, [[0, 101, 30]], now=1.0)
    # the ranks came back (new processes count from 0); the old try's lead of 101 no longer counts
    every_node_reports(stalls, 1, events=1, step=-1, now=5.0)
    assert stalls.check(now=60.0) is None
    stalls.report(0, [[0, 2, -1]], now=61.0)
    assert stalls.check(now=70.0) is None
    assert stalls.check(now=71.0).stall.rank == 1


def test_a_rank_whose_first_report_comes_after_the_others_were_checked_is_still_named():
    # node3's agent is slower: its only rank's first reading arrives after dslaunch has checked the
    # other two (who then waited in the all-reduce); the rank is behind them and must be named
    stalls = job(nodes=3, slots=1)
    stalls.report(0, [[0, 5, 1]], now=0.0)
    stalls.report(1, [[1, 5, 1]], now=0.0)
    assert stalls.check(now=1.0) is None
    stalls.report(2, [[2, 3, 0]], now=2.0)
    assert stalls.check(now=11.5) is None   # 10 s from its first reading: not yet
    stuck = stalls.check(now=12.0)
    assert (stuck.stall.rank, stuck.host, stuck.stall.step) == (2, "node3", 0)

"""--stall_timeout across nodes: dslaunch's one watch over every rank, fed by the agents' reports
(launcher/control/stalls.py), with the clock passed in."""
from launcher.control.stalls import STACKS_WAIT_SECONDS, JobStalls, QuietJob


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


def test_every_rank_stopped_alike_is_no_straggler_but_a_quiet_job():
    stalls = job(nodes=4, slots=2)
    for now in range(5):
        every_node_reports(stalls, 2, events=now, step=now, now=float(now))
    assert stalls.check(now=13.9) is None   # quiet for 9.9 s of 10
    assert stalls.check(now=1000.0) == QuietJob(quiet_s=996.0)   # nobody is behind; the stacks will tell
    assert stalls.check(now=2000.0) is None   # once a try


def test_a_node_cannot_report_another_nodes_ranks():
    stalls = job(nodes=2, slots=1)
    stalls.report(1, [[1, 5, 1]], now=0.0)
    stalls.report(0, [[0, 5, 1], [1, 9, 3]], now=1.0)   # node 0 speaking for rank 1 (node 1's) is dropped
    assert isinstance(stalls.check(now=100.0), QuietJob)   # no straggler: both at 5, and quiet since


def test_a_restart_starts_the_watch_over():
    stalls = job(nodes=2, slots=1)
    every_node_reports(stalls, 1, events=100, step=30, now=0.0)
    stalls.report(0, [[0, 101, 30]], now=1.0)
    # the ranks came back (new processes count from 0); the old try's lead of 101 no longer counts
    every_node_reports(stalls, 1, events=1, step=-1, now=5.0)
    assert stalls.check(now=14.5) is None
    stalls.report(0, [[0, 2, -1]], now=15.0)
    assert stalls.check(now=24.0) is None
    assert stalls.check(now=25.0).stall.rank == 1   # a straggler is named before the quiet job it makes


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


C10D = "/v/torch/distributed/distributed_c10d.py"


def stack_record(rank, function, file="/t.py", moved=False):
    return {"rank": rank, "frames": [[file, 9, function, ""], ["/t.py", 20, "main", ""]], "note": "", "moved": moved}


def test_output_lines_keep_a_job_without_beats_alive_and_their_silence_makes_it_quiet():
    stalls = job(nodes=2, slots=1)
    for now in range(0, 30, 5):   # a plain script: no readings, only its node's count of printed lines
        stalls.report(0, [], now=float(now), lines=now)
        assert stalls.check(now=float(now) + 0.1) is None
    stalls.report(0, [], now=30.0, lines=25)   # the same count again: nothing printed since
    assert stalls.check(now=34.0) is None
    assert stalls.check(now=35.0) == QuietJob(quiet_s=10.0)   # 10 s since the last new line, at 25


def test_a_quiet_job_is_judged_once_every_live_node_sent_its_stacks():
    stalls = job(nodes=3, slots=1)
    stalls.report(0, [], now=0.0, lines=3)
    asked = stalls.check(now=10.0)
    assert isinstance(asked, QuietJob) and asked.round == 1
    stalls.add_stacks(0, [stack_record(0, "all_reduce", C10D)], 1)
    stalls.add_stacks(1, [stack_record(1, "load_batch"), stack_record(2, "x")], 1)   # rank 2 is node 2's: dropped
    assert stalls.judge_hang(now=11.0, live_nodes={0, 1, 2}) is None   # node 2 has not answered yet
    stalls.add_stacks(2, [stack_record(2, "load_batch")], 0)   # an answer to another round: dropped
    assert stalls.judge_hang(now=11.2, live_nodes={0, 1, 2}) is None
    stalls.add_stacks(2, ["garbled", stack_record(2, "all_reduce", C10D)], 1)
    verdict = stalls.judge_hang(now=11.5, live_nodes={0, 1, 2})
    assert verdict.stops == {1: (1,)} and verdict.quiet_s == 10.0
    assert "likely cause: rank 1 on node2 is not in a collective, in load_batch" in verdict.diagnosis.message
    assert "waiting in all_reduce: ranks 0, 2 (called at /t.py:20 in main)" in verdict.diagnosis.message
    assert stalls.judge_hang(now=12.0, live_nodes={0, 1, 2}) is None   # one verdict a try


def test_a_node_that_does_not_answer_is_named_without_stacks_after_the_wait():
    stalls = job(nodes=2, slots=2)
    stalls.report(0, [], now=0.0, lines=1)
    stalls.check(now=10.0)
    stalls.add_stacks(0, [stack_record(0, "all_reduce", C10D), stack_record(1, "all_reduce", C10D)], 1)
    assert stalls.judge_hang(now=10.0 + STACKS_WAIT_SECONDS - 0.1, live_nodes={0, 1}) is None
    verdict = stalls.judge_hang(now=10.0 + STACKS_WAIT_SECONDS, live_nodes={0, 1})
    assert verdict.stops == {1: (2, 3)}
    assert "no stack from ranks 2, 3: its node's agent did not answer" in verdict.diagnosis.message


def test_a_rank_whose_stack_still_moves_shows_a_busy_job_and_the_watch_starts_again():
    stalls = job(nodes=2, slots=1)
    stalls.report(0, [], now=0.0, lines=1)   # a line at start-up; then a long silent import on both nodes
    assert stalls.check(now=10.0).round == 1
    stalls.add_stacks(0, [stack_record(0, "_find_and_load", "<frozen importlib._bootstrap>", moved=True)], 1)
    stalls.add_stacks(1, [stack_record(1, "all_reduce", C10D)], 1)
    assert stalls.judge_hang(now=11.5, live_nodes={0, 1}) is None and stalls.verdict is None
    assert stalls.check(now=20.0) is None   # quiet again from 11.5 on, not from 0
    assert stalls.check(now=21.5).round == 2   # asked again: this round's answers judge it
    stalls.add_stacks(0, [stack_record(0, "load_batch")], 2)
    stalls.add_stacks(1, [stack_record(1, "all_reduce", C10D)], 2)
    assert stalls.judge_hang(now=23.0, live_nodes={0, 1}).stops == {0: (0,)}

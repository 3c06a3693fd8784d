"""--stall_timeout, a hung job: one message from every rank's stack (launcher/node/hang.py), and the
job's quiet clock (launcher/node/stall.py QuietWatch). Pure."""
import pytest

from launcher.node.hang import SHOWN_FRAMES, diagnose, ranks_text
from launcher.node.stacks import Frame, RankStack
from launcher.node.stall import QuietWatch

C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def in_collective(rank, name="all_reduce", line=17):
    return RankStack(rank, (Frame(C10D, 3252, name), Frame("/tmp/stuck.py", line, "main", "dist.all_reduce(x)"),
                            Frame("/tmp/stuck.py", 22, "<module>", "main()")))


def in_loader(rank):
    return RankStack(rank, (Frame("/tmp/stuck.py", 9, "load_batch", "time.sleep(1000)"),
                            Frame("/tmp/stuck.py", 16, "main", "batch = load_batch(step)"),
                            Frame("/tmp/stuck.py", 22, "<module>", "main()")))


def judge(*stacks, hosts=None):
    stacks = {stack.rank: stack for stack in stacks}
    return diagnose(stacks, hosts or {rank: "localhost" for rank in stacks}, quiet_s=10.2, timeout_s=10)


def test_the_rank_outside_any_collective_is_named_with_its_frames_and_the_others_waiting():
    diagnosis = judge(in_collective(0), in_loader(1))
    assert diagnosis.causes == (1,) and diagnosis.stop == (1,)
    lines = diagnosis.message.splitlines()
    assert lines[0].startswith("no rank made progress for 10 s (--stall_timeout 10")
    assert lines[1] == "  likely cause: rank 1 is not in a collective, in load_batch (main thread, most recent call first):"
    assert lines[2] == "      /tmp/stuck.py:9 in load_batch: time.sleep(1000)"
    assert "  waiting in all_reduce: rank 0 (called at /tmp/stuck.py:17 in main)" in lines
    assert "  the other ranks wait for rank 1" in lines
    assert lines[-1].startswith("  stopping rank 1: the job ends with 137")


def test_hosts_are_named_when_the_job_spans_several():
    diagnosis = judge(in_collective(0), in_loader(1), hosts={0: "node1", 1: "node2"})
    assert "likely cause: rank 1 on node2 is not in a collective" in diagnosis.message


def test_many_waiting_ranks_are_one_line_per_collective_and_call_site():
    diagnosis = judge(*[in_collective(r) for r in (0, 1, 2, 3, 5)], in_collective(6, "barrier", line=30), in_loader(4))
    assert "  waiting in all_reduce: ranks 0-3, 5 (called at /tmp/stuck.py:17 in main)" in diagnosis.message
    assert "  waiting in barrier: rank 6 (called at /tmp/stuck.py:30 in main)" in diagnosis.message
    assert diagnosis.stop == (4,)


def test_a_deep_stack_is_cut_to_its_innermost_frames():
    deep = RankStack(1, tuple(Frame("/lib.py", n, f"f{n}") for n in range(30)))
    message = judge(in_collective(0), deep).message
    assert "/lib.py:0 in f0" in message and f"/lib.py:{SHOWN_FRAMES - 1} in" in message
    assert f"/lib.py:{SHOWN_FRAMES} in" not in message
    assert f"... {30 - SHOWN_FRAMES} more frames" in message


def test_every_rank_in_the_same_collective_points_at_the_network_and_stops_the_lowest_rank():
    diagnosis = judge(in_collective(0), in_collective(1))
    assert diagnosis.causes == () and diagnosis.stop == (0,)
    assert "every rank waits in the same collective" in diagnosis.message


def test_ranks_in_different_collectives_are_a_mismatch():
    diagnosis = judge(in_collective(0, "all_reduce"), in_collective(1, "broadcast", line=40))
    assert "not all in the same call: the ranks call collectives in different orders" in diagnosis.message


def test_a_rank_without_a_stack_is_the_suspect_when_nobody_else_is():
    diagnosis = judge(in_collective(0), RankStack(1, (), "no Python process of the rank armed the dump"))
    assert diagnosis.stop == (1,)
    assert "  no stack from rank 1: no Python process of the rank armed the dump" in diagnosis.message
    assert "rank 1 gave no stack and may be the cause" in diagnosis.message


def test_ranks_in_backward_are_suspects_only_when_nothing_else_is():
    backward = RankStack(1, (Frame("/v/torch/autograd/graph.py", 825, "_engine_run_backward"),
                             Frame("/t.py", 12, "train")))
    assert judge(in_collective(0), backward).stop == (1,)
    assert judge(in_loader(0), backward).stop == (0,)
    assert "waiting in backward: rank 1 (called at /t.py:12 in train)" in judge(in_loader(0), backward).message


@pytest.mark.parametrize("ranks, text", [([3], "rank 3"), ([0, 1], "ranks 0, 1"), ([0, 1, 2, 5, 7, 8, 9], "ranks 0-2, 5, 7-9"),
                                         ([2, 2, 1], "ranks 1, 2")])
def test_rank_lists_fold_runs(ranks, text):
    assert ranks_text(ranks) == text


def test_the_quiet_clock_starts_at_the_first_sign_of_life():
    quiet = QuietWatch(10.0)
    assert not quiet.quiet(1000.0)   # a silent start-up is not judged
    quiet.saw(5.0)
    quiet.saw(3.0)                    # a late, older report does not turn the clock back
    assert not quiet.quiet(14.9) and quiet.quiet(15.0) and quiet.quiet_for(20.0) == 15.0


def test_every_rank_in_its_own_work_is_said_so_not_that_others_wait():
    diagnosis = judge(in_loader(0), in_loader(1))
    assert diagnosis.stop == (0, 1)
    assert "no rank waits in a collective: every rank is in its own work" in diagnosis.message
    assert "the other ranks wait" not in diagnosis.message

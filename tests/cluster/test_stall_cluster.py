"""--stall_timeout on the real test cluster, judged by dslaunch over every rank of the job: a rank
on node2 stuck inside a training step, while the others wait in the step's all-reduce, is named
with its host and step, the stack of every rank on node2 reaches dslaunch's console through the
agent, and the job ends with the stuck rank's 137 (issue 33 item 3). With one rank per node, no
node sees a straggler of its own: only the job-wide watch can find it."""
import os

import pytest

from tests.helpers.timed_run import first, run_dslaunch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "dist", "workers", "stall_worker.py")
STALL_TIMEOUT = 5

pytestmark = pytest.mark.cluster


def dslaunch(hostfile, stuck_rank):   # stuck_rank: 1, or "2,3" for several
    """Run the stall worker; (return code, [(seconds since start, stream, line)])."""
    return run_dslaunch("-H", str(hostfile), "--launcher", "ssh", "--no_local_rank",
                        "--stall_timeout", str(STALL_TIMEOUT), WORKER, str(stuck_rank))


def test_the_only_rank_of_a_node_stuck_is_named_with_its_stack_and_the_job_stops(cluster_hostfile):
    code, lines = dslaunch(cluster_hostfile(2, slots=1), stuck_rank=1)
    err = "\n".join(line for _t, name, line in lines if name == "err")
    assert code == 137, err
    said = [line for _t, name, line in lines if name == "err" and "is stuck" in line]
    assert len(said) == 1, err   # once: by dslaunch, not again by a node
    assert said[0].startswith("dslaunch: rank 1 on node2 is stuck after step 2: no progress for"), said
    assert "the Python stack of every rank on node2 follows" in said[0]
    # in this order: named, then its stack (inside the sleep), then its stop and the job's end
    named = first(lines, "is stuck")
    stack = first(lines, "in sleep_inside_the_step")
    stopped = first(lines, "rank 1 on node2 was stopped as stuck")
    assert named < stack < stopped, err
    assert "finished" not in "\n".join(line for _t, name, line in lines if name == "out")


def test_a_stuck_rank_among_several_on_a_node_is_named_with_the_stacks_of_its_node(cluster_hostfile):
    code, lines = dslaunch(cluster_hostfile(2), stuck_rank=3)
    err = "\n".join(line for _t, name, line in lines if name == "err")
    assert code == 137, err
    said = [line for line in err.splitlines() if "is stuck" in line]
    assert len(said) == 1 and said[0].startswith("dslaunch: rank 3 on node2 is stuck after step 2"), err
    assert "in sleep_inside_the_step" in err
    assert "[rank 2] Current thread" in err or "[rank 2] Thread" in err, err   # its node's other rank
    assert "[rank 0] Current thread" not in err and "[rank 0] Thread" not in err, err   # not node1's
    assert "rank 3 on node2 was stopped as stuck" in err


def test_a_whole_node_stuck_is_named_as_such_with_the_stacks_of_both_its_ranks(cluster_hostfile):
    code, lines = dslaunch(cluster_hostfile(2), stuck_rank="2,3")   # node2 runs ranks 2 and 3: both asleep
    err = "\n".join(line for _t, name, line in lines if name == "err")
    assert code == 137, err
    said = [line for line in err.splitlines() if "is stuck" in line]
    assert len(said) == 1, err
    assert said[0].startswith(("dslaunch: rank 2 on node2 is stuck", "dslaunch: rank 3 on node2 is stuck")), err
    assert "(so is every other rank on node2: the whole node stopped)" in said[0], err
    for rank in (2, 3):   # both ranks' stacks, inside the sleep
        assert any(line.startswith(f"[rank {rank}]") and "in sleep_inside_the_step" in line
                   for line in err.splitlines()), err
    assert "[rank 0] Current thread" not in err and "[rank 0] Thread" not in err, err   # not node1's
    assert "was stopped as stuck" in err


@pytest.mark.timing
def test_the_stuck_rank_is_named_within_the_timeout_and_5_seconds(cluster_hostfile):
    code, lines = dslaunch(cluster_hostfile(2, slots=1), stuck_rank=1)
    assert code == 137
    asleep = lines[first(lines, "going to sleep", stream="out")][0]
    named = lines[first(lines, "is stuck")][0]
    # the bound is S + 5 s; 20 s more for a loaded machine (the output relay, ssh, the polls)
    assert named - asleep < STALL_TIMEOUT + 5 + 20, (asleep, named)

"""--stall_timeout on the real test cluster when no rank of a plain torch.distributed script makes
progress (issue 42 item 1): the stuck rank's stack is taken on its own node by its agent, every
node's stacks reach dslaunch, and dslaunch alone says one message for the job naming the rank
outside the collective (with its host and frames) and the ranks waiting in all_reduce, then has the
stuck rank's node stop it: the job ends with 137."""
import os

import pytest

from tests.helpers.timed_run import first, run_dslaunch, stream_text

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "dist", "workers", "hang_worker.py")
STALL_TIMEOUT = 10
JUDGED = "every rank's Python stack was taken"

pytestmark = pytest.mark.cluster


def dslaunch(hostfile, stuck_rank):
    return run_dslaunch("-H", str(hostfile), "--launcher", "ssh", "--no_local_rank",
                        "--stall_timeout", str(STALL_TIMEOUT), WORKER, str(stuck_rank))


def test_the_only_rank_of_a_node_hung_in_its_loader_is_named_from_its_stack(cluster_hostfile):
    code, lines = dslaunch(cluster_hostfile(2, slots=1), stuck_rank=1)
    err = stream_text(lines)
    assert code == 137, err
    assert err.count(JUDGED) == 1, err   # by dslaunch, once: not by each node
    assert "likely cause: rank 1 on node2 is not in a collective, in load_batch" in err, err
    assert f"{WORKER}:" in err and " in load_batch: time.sleep(1000)" in err, err
    assert "waiting in all_reduce: rank 0 (called at" in err, err
    assert "rank 1 on node2 was stopped as hung" in err
    asleep, named = lines[first(lines, "loading the batch of step 2", "out")][0], lines[first(lines, JUDGED)][0]
    print(f"\nhang to message on the cluster: {named - asleep:.1f} s (--stall_timeout {STALL_TIMEOUT})")


def test_one_rank_of_several_hung_is_named_and_the_other_nodes_ranks_wait_in_one_line(cluster_hostfile):
    code, lines = dslaunch(cluster_hostfile(2, slots=2), stuck_rank=3)   # node2 runs ranks 2 and 3
    err = stream_text(lines)
    assert code == 137, err
    assert err.count(JUDGED) == 1, err
    assert "likely cause: rank 3 on node2 is not in a collective, in load_batch" in err, err
    assert "waiting in all_reduce: ranks 0-2 (called at" in err, err
    assert "rank 3 on node2 was stopped as hung" in err

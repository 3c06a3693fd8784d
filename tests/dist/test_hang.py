"""--stall_timeout on a plain torch.distributed script in which no rank makes progress (issue 42
item 1): rank 1 sleeps in its data loader while rank 0 waits in all_reduce. dslaunch takes every
rank's Python stack, says in one message that rank 1 is outside any collective (with its frames)
and that rank 0 waits in all_reduce, stops rank 1, and the job ends with 137 (or restarts). The
cluster version is in tests/cluster/test_hang_cluster.py."""
import os

from tests.helpers.timed_run import first, run_dslaunch, stream_text
from tests.helpers.world import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "dist", "workers", "hang_worker.py")
STALL_TIMEOUT = 10
JUDGED = "every rank's Python stack was taken"


def line_of(code):
    """The worker's line number of `code` (the frames the message shows)."""
    with open(WORKER) as handle:
        return next(n for n, line in enumerate(handle, 1) if line.strip() == code)


def dslaunch(*args):
    return run_dslaunch("--master_port", str(free_port()), "--num_gpus", "2", "--no_local_rank",
                        "--stall_timeout", str(STALL_TIMEOUT), *args, WORKER, timeout=240)


def test_a_plain_script_where_no_rank_moves_names_the_rank_outside_the_collective_and_stops():
    code, lines = dslaunch()
    err = stream_text(lines)
    assert code == 137, err
    assert "finished" not in stream_text(lines, "out")
    assert err.count(JUDGED) == 1, err   # one message for the job
    message = err[err.index("dslaunch: no rank made progress"):].split("\ndslaunch: ")[0]
    assert f"(--stall_timeout {STALL_TIMEOUT}: " in message
    assert "likely cause: rank 1 is not in a collective, in load_batch" in message, message
    assert f"      {WORKER}:{line_of('time.sleep(1000)')} in load_batch: time.sleep(1000)" in message, message
    assert f"      {WORKER}:{line_of('batch = load_batch(step)')} in main: batch = load_batch(step)" in message
    assert f"waiting in all_reduce: rank 0 (called at {WORKER}:{line_of('dist.all_reduce(batch)')} in main)" \
        in message, message
    assert "stopping rank 1: the job ends with 137" in message
    assert "rank 1 on localhost was stopped as hung: no rank made progress for" in err
    asleep, named = lines[first(lines, "loading the batch of step 2", "out")][0], lines[first(lines, JUDGED)][0]
    print(f"\nhang to message: {named - asleep:.1f} s (--stall_timeout {STALL_TIMEOUT})")   # for the record, not a bound


def test_under_max_restarts_a_hung_job_is_restarted_and_judged_again():
    code, lines = dslaunch("--max_restarts", "1")
    err = stream_text(lines)
    assert code == 137, err
    assert err.count(JUDGED) == 2, err   # once a try
    assert err.count("likely cause: rank 1 is not in a collective, in load_batch") == 2, err

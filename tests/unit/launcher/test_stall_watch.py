"""StallWatch: which rank is stuck, from progress readings and a clock passed in."""
from launcher.node.stall import StallWatch, read_progress


def test_the_rank_left_behind_is_named_once_the_others_have_been_past_it_for_the_timeout():
    watch = StallWatch(10.0)
    for rank in (0, 1, 2):
        watch.observe(rank, 5, 1, now=0.0)
    watch.observe(0, 6, 1, now=1.0)   # ranks 0 and 2 enter backward's all-reduce; rank 1 never does
    watch.observe(2, 6, 1, now=2.0)
    assert watch.stuck(now=10.9) is None
    stall = watch.stuck(now=11.0)
    assert (stall.rank, stall.step, stall.others_step, stall.behind_s) == (1, 1, 1, 10.0)


def test_ranks_that_move_together_or_all_stop_alike_are_not_stuck():
    watch = StallWatch(1.0)
    for now in range(20):
        for rank in (0, 1):
            watch.observe(rank, now, now // 3, now=float(now) + rank * 0.5)
    assert watch.stuck(now=19.9) is None
    assert watch.stuck(now=500.0) is None   # both stopped at the same count: a hang, not a straggler


def test_a_slow_rank_that_keeps_moving_is_not_stuck():
    watch = StallWatch(5.0)
    watch.observe(0, 10, 2, now=0.0)
    watch.observe(1, 4, 0, now=0.0)
    watch.observe(1, 5, 1, now=4.0)    # behind, but it moved within the timeout
    assert watch.stuck(now=8.0) is None
    assert watch.stuck(now=9.0).rank == 1


def test_progress_files_are_read_as_events_and_step(tmp_path):
    path = tmp_path / "rank_0.progress"
    assert read_progress(str(path)) is None
    path.write_text("12 3\n".ljust(40))
    assert read_progress(str(path)) == (12, 3)


def test_a_long_job_keeps_a_bounded_history():
    watch = StallWatch(5.0)
    for events in range(1, 10_001):
        for rank in (0, 1):
            watch.observe(rank, events, events // 3, now=events * 0.01 + rank * 0.001)
        watch.stuck(now=events * 0.01)
    assert len(watch.lead_history) <= 2
    watch.observe(0, 10_001, 3333, now=200.0)   # rank 1 stops; rank 0 goes on
    assert watch.stuck(now=204.9) is None and watch.stuck(now=205.0).rank == 1


def test_a_rank_first_seen_below_the_others_after_a_check_is_behind_them():
    watch = StallWatch(5.0)
    watch.observe(0, 8, 2, now=0.0)
    watch.observe(1, 8, 2, now=0.0)
    assert watch.stuck(now=1.0) is None   # all seen so far are alike
    watch.observe(2, 6, 1, now=3.0)       # its first reading: the others passed 6 before it came
    assert watch.stuck(now=7.9) is None
    stall = watch.stuck(now=8.0)
    assert (stall.rank, stall.step, stall.others_step) == (2, 1, 2)
    watch.observe(0, 9, 2, now=8.5)       # the lead moves on: still the one behind
    assert watch.stuck(now=9.0).rank == 2

"""The interleaved 1F1B schedule: torch.distributed.pipelining's order, and it runs to the end.

A pure simulation executes every rank's action list with non-blocking sends and blocking receives
over one FIFO per (sender, receiver, kind), as the engine does: it must finish (no deadlock) and
every receive must find the message it expects at the head of its queue.
"""
from collections import deque

import pytest

from launcher.zero.errors import ConfigError
from launcher.zero.pipeline.schedule import BACKWARD, FORWARD, build_schedule

SIZES = [(2, 2, 2), (4, 2, 2), (8, 2, 2), (4, 2, 3), (8, 4, 2), (4, 4, 2), (3, 4, 2), (6, 4, 2), (12, 4, 3)]


def _torch_order(micro, stages, chunks, rank):
    """ScheduleInterleaved1F1B's own per-rank order (its pipeline_order without the idle slots)."""
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, _ComputationType

    schedule = object.__new__(ScheduleInterleaved1F1B)
    schedule.pp_group_size, schedule.n_local_stages, schedule._n_microbatches = stages, chunks, micro
    schedule.number_of_rounds = max(1, micro // stages)
    schedule.microbatches_per_round = micro // schedule.number_of_rounds
    order = []
    for action in schedule._calculate_single_rank_operations(rank):
        if action is not None:
            kind = FORWARD if action.computation_type == _ComputationType.FORWARD else BACKWARD
            order.append((kind, action.microbatch_index, action.stage_index // stages))
    return order


@pytest.mark.parametrize("micro, stages, chunks", SIZES)
def test_the_order_is_torch_pipelinings_interleaved_1f1b(micro, stages, chunks):
    for rank in range(stages):
        assert build_schedule("interleaved", micro, stages, rank, chunks) == _torch_order(micro, stages, chunks, rank)


def _simulate(micro, stages, chunks):
    """Run every rank's list; returns the number of actions executed (raises on deadlock or a mismatch)."""
    lists = [deque(build_schedule("interleaved", micro, stages, rank, chunks)) for rank in range(stages)]
    last = stages * chunks - 1
    queues: dict[tuple, deque] = {}
    done = 0
    while any(lists):
        progressed = False
        for rank, actions in enumerate(lists):
            while actions:
                kind, m, chunk = actions[0]
                virtual = chunk * stages + rank
                source = virtual - 1 if kind == FORWARD else virtual + 1
                if 0 <= source <= last:    # needs a message from that virtual stage's rank
                    queue = queues.setdefault((source % stages, rank, kind), deque())
                    if not queue:
                        break
                    assert queue.popleft() == (virtual, m), (rank, actions[0])
                target = virtual + 1 if kind == FORWARD else virtual - 1
                if 0 <= target <= last:
                    queues.setdefault((rank, target % stages, kind), deque()).append((target, m))
                actions.popleft()
                done += 1
                progressed = True
        assert progressed, f"deadlock: {[list(a)[:2] for a in lists]}"
    return done


@pytest.mark.parametrize("micro, stages, chunks", SIZES)
def test_every_rank_finishes_without_deadlock(micro, stages, chunks):
    assert _simulate(micro, stages, chunks) == 2 * micro * stages * chunks


@pytest.mark.parametrize("micro, stages, chunks", SIZES)
def test_each_chunk_runs_each_micro_batch_forward_then_backward_once(micro, stages, chunks):
    for rank in range(stages):
        actions = build_schedule("interleaved", micro, stages, rank, chunks)
        for chunk in range(chunks):
            for m in range(micro):
                assert actions.count((FORWARD, m, chunk)) == 1 == actions.count((BACKWARD, m, chunk))
                assert actions.index((FORWARD, m, chunk)) < actions.index((BACKWARD, m, chunk))


def test_the_first_rank_warms_up_longer_than_plain_1f1b():
    # (V - 1) x rounds' micro-batches + 2 x (P - 1 - rank) forwards before the first backward
    actions = build_schedule("interleaved", 8, 4, 0, 2)
    assert [a[0] for a in actions[:11]] == [FORWARD] * 11 and actions[11][0] == BACKWARD
    assert actions[:5] == [(FORWARD, 0, 0), (FORWARD, 1, 0), (FORWARD, 2, 0), (FORWARD, 3, 0), (FORWARD, 0, 1)]


@pytest.mark.parametrize("name, micro, stages, chunks, match", [
    ("interleaved", 4, 2, 1, "interleaving needs"),      # no virtual stages
    ("1f1b", 4, 2, 2, "interleaving needs"),             # virtual stages under a plain schedule
    ("interleaved", 4, 1, 2, "interleaving needs"),      # one stage
    ("interleaved", 6, 4, 2, None), ("interleaved", 5, 4, 2, None),   # one round: any count < 2P
    ("interleaved", 10, 4, 2, None), ("interleaved", 9, 4, 2, "not a multiple"),
])
def test_bad_interleaving_is_a_config_error(name, micro, stages, chunks, match):
    if match is None:
        build_schedule(name, micro, stages, 0, chunks)
        return
    with pytest.raises(ConfigError, match=match):
        build_schedule(name, micro, stages, 0, chunks)

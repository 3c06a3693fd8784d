"""Pipeline schedules as data: the ordered (action, micro-batch) list each stage executes.

Pure, so the order is testable without processes. A forward on stage s > 0 first receives its
input from s - 1 and a forward on s < last sends its output on; a backward does the same with
gradients in the other direction. Sends are non-blocking and receives blocking, so any order in
which every stage's dependencies come earlier in its neighbours' lists cannot deadlock.

Why not ``torch.distributed.pipelining`` (torch 2.13) itself: its ``ScheduleInterleaved1F1B`` gives
the order we want, and we copy that order exactly (a unit test compares the two). Its runtime does
not fit the engine around it: its ``step(x, target=...)`` splits one batch itself, where
``train_batch`` pulls DeepSpeed's ``(inputs, labels)`` micro-batches from an iterator; it scales and
computes the loss on its own, where ours carries the fp16 loss scale and the micro-batch divisor;
and the step after the schedule (data-axis average, tied weights summed across stages, the one
global clip norm, an overflow skipping every stage, ZeRO-1 over the data axis) stays ours anyway.
So the three schedules share one small runtime (``engine.py`` over ``p2p.py``, gloo and NCCL).
"""
from __future__ import annotations

from typing import NamedTuple

from launcher.zero.errors import ConfigError

FORWARD, BACKWARD = "forward", "backward"
SCHEDULES = ("1f1b", "gpipe", "interleaved")


class Action(NamedTuple):
    kind: str          # FORWARD or BACKWARD
    micro_batch: int


class ChunkAction(NamedTuple):
    """An action of an interleaved schedule: ``chunk`` is which of the rank's virtual stages runs it."""
    kind: str
    micro_batch: int
    chunk: int


def gpipe(num_micro_batches: int, num_stages: int, stage_id: int) -> list[Action]:
    """All forwards, then all backwards (in reverse): the most activation memory, the same bubble."""
    return ([Action(FORWARD, m) for m in range(num_micro_batches)]
            + [Action(BACKWARD, m) for m in reversed(range(num_micro_batches))])


def one_f_one_b(num_micro_batches: int, num_stages: int, stage_id: int) -> list[Action]:
    """1F1B: warm up with (stages - stage - 1) forwards, then alternate, then drain the backwards.

    A stage holds at most ``num_stages - stage_id`` micro-batches' activations (GPipe: all of them).
    """
    warmup = min(num_stages - stage_id - 1, num_micro_batches)
    actions = [Action(FORWARD, m) for m in range(warmup)]
    next_backward = 0
    for m in range(warmup, num_micro_batches):
        actions.append(Action(FORWARD, m))
        actions.append(Action(BACKWARD, next_backward))
        next_backward += 1
    actions.extend(Action(BACKWARD, m) for m in range(next_backward, num_micro_batches))
    return actions


def interleaved_1f1b(num_micro_batches: int, num_stages: int, stage_id: int, num_chunks: int) -> list[ChunkAction]:
    """Interleaved 1F1B (Narayanan et al. 2021) in ``torch.distributed.pipelining``'s exact order.

    Rank ``stage_id`` holds chunks (virtual stages) ``stage_id, stage_id + P, ...``. Micro-batches go in
    rounds of ``M // max(1, M // P)``; the forward of step k runs chunk ``(k // per_round) % V``, the
    k-th backward chunk ``V - 1 - (k // per_round) % V`` (depth first), after
    ``(V - 1) * per_round + 2 * (P - 1 - stage_id)`` warm-up forwards. The order is the same function
    of the step on every rank, so each pair of ranks sends and receives every kind in the same order.
    """
    rounds = max(1, num_micro_batches // num_stages)
    if num_micro_batches % rounds:
        raise ConfigError(f"pipeline.schedule interleaved: {num_micro_batches} micro-batches is not a multiple of "
                          f"the {rounds} rounds of {num_stages} stages",
                          hint=f"gradient_accumulation_steps a multiple of {num_stages}, or at most {num_stages}")
    per_round = num_micro_batches // rounds
    total = num_micro_batches * num_chunks
    warmup = min((num_chunks - 1) * per_round + 2 * (num_stages - 1 - stage_id), total)
    next_micro = {FORWARD: [0] * num_chunks, BACKWARD: [0] * num_chunks}

    def take(kind: str, chunk: int) -> ChunkAction:
        micro = next_micro[kind][chunk]
        next_micro[kind][chunk] += 1
        return ChunkAction(kind, micro, chunk)

    actions = []
    for step in range(total + warmup):
        if step < total:
            actions.append(take(FORWARD, (step // per_round) % num_chunks))
        if step >= warmup:
            actions.append(take(BACKWARD, num_chunks - 1 - ((step - warmup) // per_round) % num_chunks))
    return actions


def build_schedule(name: str, num_micro_batches: int, num_stages: int, stage_id: int,
                   num_chunks: int = 1) -> list:
    """The actions of ``stage_id`` under the schedule ``name`` (``pipeline.schedule`` in the config).

    ``num_chunks`` is the module's ``num_virtual_stages``: more than one needs ``interleaved`` and back.
    """
    key = name.lower().replace("-", "").replace("_", "")
    if key == "interleaved" or num_chunks > 1:
        if key != "interleaved" or num_chunks < 2 or num_stages < 2:
            raise ConfigError(f"pipeline.schedule '{name}' with {num_chunks} virtual stage(s) per rank and "
                              f"{num_stages} stages: interleaving needs both at least 2",
                              hint='PipelineModule(..., num_virtual_stages=2) with "pipeline": '
                                   '{"schedule": "interleaved"} on >= 2 stages')
        return interleaved_1f1b(num_micro_batches, num_stages, stage_id, num_chunks)
    if key == "1f1b":
        return one_f_one_b(num_micro_batches, num_stages, stage_id)
    if key == "gpipe":
        return gpipe(num_micro_batches, num_stages, stage_id)
    raise ConfigError(f"pipeline.schedule: '{name}' is not one of {', '.join(SCHEDULES)}",
                      hint='"pipeline": {"schedule": "1f1b"}')

"""Pipeline schedules as data: the ordered (action, micro-batch) list each stage executes.

Pure, so the order is testable without processes. A forward on stage s > 0 first receives its
input from s - 1 and a forward on s < last sends its output on; a backward does the same with
gradients in the other direction. Sends are non-blocking and receives blocking, so any order in
which every stage's dependencies come earlier in its neighbours' lists cannot deadlock.
"""
from __future__ import annotations

from typing import NamedTuple

from launcher.zero.errors import ConfigError

FORWARD, BACKWARD = "forward", "backward"
SCHEDULES = ("1f1b", "gpipe")


class Action(NamedTuple):
    kind: str          # FORWARD or BACKWARD
    micro_batch: int


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


def build_schedule(name: str, num_micro_batches: int, num_stages: int, stage_id: int) -> list[Action]:
    """The actions of ``stage_id`` under the schedule ``name`` (``pipeline.schedule`` in the config)."""
    key = name.lower().replace("-", "").replace("_", "")
    if key == "1f1b":
        return one_f_one_b(num_micro_batches, num_stages, stage_id)
    if key == "gpipe":
        return gpipe(num_micro_batches, num_stages, stage_id)
    raise ConfigError(f"pipeline.schedule: '{name}' is not one of {', '.join(SCHEDULES)}",
                      hint='"pipeline": {"schedule": "1f1b"}')

"""Rank output on its way from the inbox to the console: decoded and printed in batches,
filtered by `--output` (launcher/output_modes.py).

At 1024 nodes x 8 ranks x 10 lines/s a line-by-line relay (one json.loads, one write and
one flush each) is most of a core; a batch costs one json.loads and one write per stream.
"""
from __future__ import annotations

import queue
import time

from launcher import console
from launcher.control.inbox import decode_batch
from launcher.node.process import RankExit, RankOutput
from launcher.output_modes import OutputFilter

BATCH_LINES = 20_000   # lines per loop turn: a turn stays short, so events are never kept waiting long


class OutputRelay:
    def __init__(self, mode: str):
        self.filter = OutputFilter(mode)

    @staticmethod
    def pending(inbox) -> bool:
        return not inbox.output.empty()

    def print_some(self, inbox, last_heard: dict, budget: int = BATCH_LINES) -> None:
        """Print up to about `budget` waiting lines; every node heard from counts as alive."""
        lines: list[bytes] = []
        now = time.monotonic()
        while len(lines) < budget:
            try:
                node_rank, raw = inbox.output.get_nowait()
            except queue.Empty:
                break
            last_heard[node_rank] = now
            lines += raw
        if lines:
            self.show(decode_batch(lines))

    def print_all(self, inbox, last_heard: dict) -> None:
        while self.pending(inbox):
            self.print_some(inbox, last_heard)

    def show(self, messages: list[dict]) -> None:
        out, err = [], []
        every = self.filter.mode == "all"
        for message in messages:
            try:
                rank, line = message["rank"], message["line"]
            except (KeyError, TypeError):
                continue   # not an output message after all: nothing to print
            if every or self.filter.shows(rank):
                (out if message.get("stream") == "stdout" else err).append((rank, str(line)))
        console.write_rank_lines(out, err)

    def exited(self, done: RankExit, stopping: bool) -> None:
        """Under `--output failures`, a failed rank's last lines."""
        tail = self.filter.tail_to_print(done.rank, done.returncode, done.tail, stopping)
        if tail:
            console.say(f"rank {done.rank} failed; its last {len(tail)} lines (held by --output failures):")
            console.print_rank_lines([RankOutput(done.rank, "stderr", line) for line in tail])

    def add_held(self, count) -> None:
        """Lines an agent did not send (its "done" says how many) count as held too."""
        if type(count) is int and count > 0:
            self.filter.add_held(count)

    def summary(self, log_dir: str | None) -> str | None:
        return self.filter.summary(log_dir)

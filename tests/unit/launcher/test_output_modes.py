"""--output all|rank0|failures|none (launcher/output_modes.py): what is shown, what is held, the summary."""
import threading
import time

import pytest

from launcher import console
from launcher.node.process import RankOutput
from launcher.output_modes import OutputFilter, releases_tail, shows, summary

SHOWS = [  # (mode, rank, shown as it comes)
    ("all", 0, True), ("all", 7, True),
    ("rank0", 0, True), ("rank0", 1, False),
    ("failures", 0, True), ("failures", 3, False),
    ("none", 0, False), ("none", 5, False),
]


@pytest.mark.parametrize("mode, rank, shown", SHOWS)
def test_which_rank_lines_are_shown(mode, rank, shown):
    assert shows(mode, rank) is shown


RELEASES = [  # (mode, rank, returncode, stopping, its last lines printed at its exit)
    ("failures", 1, 1, False, True),     # failed by itself
    ("failures", 1, 1, True, True),      # failed by itself while the job was stopping
    ("failures", 1, -9, False, True),    # killed, not by us
    ("failures", 1, -15, True, False),   # killed by the stop after another rank's failure
    ("failures", 1, 0, False, False),    # succeeded
    ("failures", 0, 1, False, False),    # rank 0's lines were shown already
    ("rank0", 1, 1, False, False), ("all", 1, 1, False, False), ("none", 1, 1, False, False),
]


@pytest.mark.parametrize("mode, rank, returncode, stopping, released", RELEASES)
def test_which_exits_print_the_held_last_lines(mode, rank, returncode, stopping, released):
    assert releases_tail(mode, rank, returncode, stopping) is released


SUMMARIES = [  # (mode, held, log_dir, closing line or None)
    ("all", 0, None, None),
    ("rank0", 12, "/logs", "--output rank0: 12 rank output lines not shown; "
                           "every rank's full log is in /logs/rank_<R>.log on the rank's node"),
    ("none", 1, None, "--output none: 1 rank output line not shown; pass --log_dir DIR to keep every rank's full log"),
    ("failures", 0, None, "--output failures: 0 rank output lines not shown; "
                          "pass --log_dir DIR to keep every rank's full log"),
]


@pytest.mark.parametrize("mode, held, log_dir, line", SUMMARIES)
def test_the_closing_summary(mode, held, log_dir, line):
    assert summary(mode, held, log_dir) == line


def test_the_filter_counts_what_it_holds_and_tells_a_stop_from_a_failure():
    kept = OutputFilter("failures")
    assert [kept.shows(r) for r in (0, 1, 2, 1)] == [True, False, False, False]
    assert kept.held == 3
    assert kept.tail_to_print(2, 1, ["boom"]) == ("boom",)
    assert kept.tail_to_print(1, -15, ["stopped"]) == ()   # after rank 2's failure: a stopped rank


class YieldingInt(int):
    """A count whose `+` lets another thread run halfway, as a free-threaded Python may at any point
    (with the GIL, `held += 1` on a plain int is rarely interrupted, so a race would hide)."""

    def __add__(self, other):
        time.sleep(0)
        return YieldingInt(int(self) + other)


def test_held_lines_counted_by_every_output_thread_at_once_are_all_counted():
    """A node's agent counts held lines from every rank's two output threads: none may be lost."""
    kept = OutputFilter("rank0")
    kept.held = YieldingInt(0)
    threads = [threading.Thread(target=lambda: [kept.shows(1) for _ in range(500)]) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert kept.held == 8 * 500
    assert kept.summary(None).startswith("--output rank0: 4000 rank output lines not shown")


class CountingStream:
    def __init__(self):
        self.writes, self.text = 0, ""

    def write(self, text):
        self.writes += 1
        self.text += text

    def flush(self):
        pass


def test_a_batch_of_rank_lines_is_one_write_per_stream(monkeypatch):
    out, err = CountingStream(), CountingStream()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", err)
    console.print_rank_lines([RankOutput(r, "stdout", f"line {r}") for r in range(500)]
                             + [RankOutput(1, "stderr", "warning")])
    assert (out.writes, err.writes) == (1, 1)
    assert out.text.splitlines()[:2] == ["[rank 0] line 0", "[rank 1] line 1"] and err.text == "[rank 1] warning\n"

"""What dslaunch prints about a failed job: one message, no doubled prefixes, hints that fit."""
import pytest

from launcher import console
from launcher.node.process import RankExit, RankOutput


def exit_(rank, code, *tail):
    return RankExit(rank, rank, code, tail, "localhost")


@pytest.mark.parametrize("exits, says, not_says", [
    # every rank ended as the first failure did
    ((exit_(0, 1, "ImportError: no module named x"), exit_(1, 1, "ImportError: no module named x")),
     "all 2 ranks failed the same way", "every other rank was stopped"),
    # the others were stopped by dslaunch (SIGTERM), not failed alike
    ((exit_(0, 1, "ImportError: no module named x"), exit_(1, -15)),
     "every other rank was stopped", "same way"),
])
def test_summary_says_whether_every_rank_failed_alike(exits, says, not_says):
    text = console.failure_summary(exits[0], exits=exits)
    assert says in text and not_says not in text


def test_a_ranks_exit_code_2_is_not_taken_for_a_dslaunch_usage_error():
    text = console.failure_summary(exit_(1, 2, "error: the following arguments are required: --data"))
    assert "the script's own exit code 2, not a dslaunch usage error" in text
    assert "hint:" not in text


def test_an_engine_error_line_is_not_repeated_in_the_summary():
    failure = exit_(0, 2, "dslaunch: config error: ds.json: unknown config key 'zero_optimisation'",
                    "  hint: did you mean 'zero_optimization'?")
    text = console.failure_summary(failure)
    assert "zero_optimisation" not in text and "stopped it on a config error" in text


PREFIXED = [  # (rank, the rank's line, what dslaunch shows)
    (1, "[rank1]: Traceback (most recent call last):", "[rank 1] Traceback (most recent call last):"),
    (1, "[rank1]:   File \"train.py\", line 3", "[rank 1]   File \"train.py\", line 3"),
    (1, "[rank0]: not this rank's prefix", "[rank 1] [rank0]: not this rank's prefix"),
    (0, "loss 2.3", "[rank 0] loss 2.3"),
]


def test_torch_distributed_rank_prefix_is_not_doubled(capsys):
    for rank, line, _shown in PREFIXED:
        console.print_rank_line(RankOutput(rank, "stderr", line))
    assert capsys.readouterr().err.splitlines() == [shown for _r, _l, shown in PREFIXED]


ABORTED_AFTER_RAISE = (  # a gloo script's rank 0 raised; torch then aborted the process at exit
    "[rank0]: Traceback (most recent call last):", '[rank0]:   File "/tmp/c.py", line 7, in <module>',
    '[rank0]:     raise ValueError("boom on rank 0")', "[rank0]: ValueError: boom on rank 0",
    "terminate called without an active exception")


def test_the_summary_names_the_exception_a_rank_raised_even_when_a_signal_ended_it():
    text = console.failure_summary(exit_(0, -6, *ABORTED_AFTER_RAISE)).splitlines()[0]
    assert text.startswith("rank 0 on localhost was killed (SIGABRT): ValueError: boom on rank 0 (the script raised it")
    plain = console.failure_summary(exit_(1, 1, "Traceback (most recent call last):", '  File "t.py", line 1',
                                          "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"))
    assert plain.splitlines()[0].startswith("rank 1 on localhost exited with code 1: torch.OutOfMemoryError: CUDA out")


@pytest.mark.parametrize("tail", [
    ("loss 2.3", "Killed"),                                                       # no traceback: nothing named
    ("Traceback (most recent call last):", '  File "t.py", line 9, in <module>',   # cut before its last line,
     '    return {"loss": loss}'),                                       # a source line is not the exception
    ("ValueError: printed by the script, not raised", "exit"),
])
def test_no_exception_is_named_without_a_whole_traceback(tail):
    assert console.raised_exception(list(tail)) is None

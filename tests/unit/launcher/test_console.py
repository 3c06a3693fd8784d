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

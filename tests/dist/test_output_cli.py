"""`--output all|rank0|failures|none` through the real launcher: what the console shows, the summary."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANKS = os.path.join("tests", "scripts", "ranks.py")


def dslaunch(*args):
    return subprocess.run([sys.executable, "-m", "launcher", "--num_gpus", "3", *args], capture_output=True,
                          text=True, timeout=90, cwd=ROOT)


def ranks_seen(text):
    return sorted({int(r) for r in re.findall(r"^\[rank (\d+)\]", text, re.MULTILINE)})


@pytest.mark.parametrize("mode, shown, held", [
    ("all", [0, 1, 2], None),
    ("rank0", [0], 4),    # ranks 1 and 2: their pid line and 'rested'
    ("none", [], 6),
])
def test_each_mode_shows_its_ranks_and_counts_the_rest(tmp_path, mode, shown, held):
    done = dslaunch("--output", mode, "--log_dir", str(tmp_path), RANKS, "nap", "0")
    assert done.returncode == 0, done.stderr
    assert ranks_seen(done.stdout + done.stderr) == shown
    closing = f"dslaunch: --output {mode}: {held} rank output lines not shown; every rank's full log is in " \
              f"{tmp_path}/rank_<R>.log on the rank's node"
    assert (closing in done.stderr) is (held is not None), done.stderr
    assert "rested" in (tmp_path / "rank_2.log").read_text()   # the full log has what the console did not


def test_failures_mode_prints_the_last_lines_of_the_rank_that_failed(tmp_path):
    done = dslaunch("--output", "failures", RANKS, "fail", "1", "3", str(tmp_path))   # once all 3 started
    assert done.returncode == 3
    assert ranks_seen(done.stdout) == [0]          # rank 0 live; ranks 1 and 2 held
    assert "dslaunch: rank 1 failed; its last 2 lines (held by --output failures):" in done.stderr
    assert "[rank 1] failing on purpose" in done.stderr
    assert not re.search(r"^\[rank 2\]", done.stderr, re.MULTILINE)   # stopped, not failed: still held
    assert "pass --log_dir DIR to keep every rank's full log" in done.stderr


def test_dry_run_shows_the_output_mode_and_log_dir():
    import json
    done = dslaunch("--output", "rank0", "--log_dir", "/tmp/logs", "--dry-run", "--json", RANKS, "nap", "0")
    document = json.loads(done.stdout)
    assert (document["output"], document["log_dir"]) == ("rank0", "/tmp/logs")
    text = dslaunch("--output", "none", "--dry-run", RANKS, "nap", "0").stdout
    assert "output: none (rank lines on this console); no --log_dir" in text


def test_an_unknown_mode_is_a_usage_error():
    done = dslaunch("--output", "some", RANKS, "nap", "0")
    assert done.returncode == 2 and "dslaunch: usage error:" in done.stderr and "Traceback" not in done.stderr

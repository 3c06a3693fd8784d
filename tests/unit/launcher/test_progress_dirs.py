"""Progress folders (--stall_timeout) are named for the launcher's pid; those of a launcher that was
SIGKILLed are removed at the next start, those of one still running are left alone."""
import os
import subprocess
import sys

from launcher.node.stall import PROGRESS_PREFIX, make_progress_dir


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_folders_of_dead_launchers_are_swept_and_the_living_ones_kept(tmp_path):
    gone = tmp_path / f"{PROGRESS_PREFIX}{dead_pid()}-abc123"
    gone.mkdir()
    (gone / "rank_0.progress").write_text("3 1\n")
    living = tmp_path / f"{PROGRESS_PREFIX}{os.getppid()}-def456"
    living.mkdir()
    unrelated = tmp_path / f"{PROGRESS_PREFIX}notapid"
    unrelated.mkdir()
    made = make_progress_dir(str(tmp_path))
    assert os.path.basename(made).startswith(f"{PROGRESS_PREFIX}{os.getpid()}-")
    assert not gone.exists()
    assert living.exists() and unrelated.exists() and os.path.isdir(made)

"""--max_restarts through the real launcher on this machine (local runner, 2 CPU ranks)."""
import json
import os
import signal
import subprocess
import sys
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANKS = os.path.join(ROOT, "tests", "scripts", "ranks.py")


def dslaunch(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def launcher_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("dslaunch:")]


def test_a_rank_that_crashes_once_is_restarted_and_the_job_finishes(tmp_path):
    marker = tmp_path / "crashed"
    done = dslaunch("--num_gpus", "2", "--max-restarts", "2", RANKS, "crash-once", "1", str(marker))
    assert done.returncode == 0, done.stderr
    counts = [json.loads(line.split("RESTART_COUNT ", 1)[1]) for line in done.stdout.splitlines()
              if "RESTART_COUNT " in line]
    assert counts == [{"DSLAUNCH_RESTART_COUNT": "1", "TORCHELASTIC_RESTART_COUNT": "1"}] * 2
    restart_lines = [line for line in launcher_lines(done.stderr) if "restart 1/2:" in line]
    assert len(restart_lines) == 1
    assert "rank 1" in restart_lines[0] and "code 3" in restart_lines[0] and "restarting on 1 node(s)" in restart_lines[0]
    assert "dslaunch: 1 of 2 restart(s) used" in done.stderr


def test_a_rank_that_crashes_every_time_uses_up_the_restarts_and_exits_with_its_code():
    done = dslaunch("--num_gpus", "2", "--max_restarts", "2", RANKS, "crash-always", "0", "5")
    assert done.returncode == 5, done.stderr
    assert [line for line in launcher_lines(done.stderr) if ": restart " in line][-1].startswith("dslaunch: restart 2/2")
    assert "no restart left" in done.stderr
    assert "dslaunch: 2 of 2 restart(s) used" in done.stderr
    assert done.stderr.count("[rank 0] crash on try") == 3


def test_a_failure_that_repeats_at_once_the_same_way_stops_retrying_early():
    done = dslaunch("--num_gpus", "2", "--max_restarts", "5", RANKS, "fail", "1", "7")
    assert done.returncode == 7, done.stderr
    assert "again, the same way" in done.stderr and "not restarting" in done.stderr
    assert "dslaunch: 1 of 5 restart(s) used" in done.stderr
    assert done.stderr.count("[rank 1] failing on purpose") == 2


def test_without_restarts_the_first_failure_still_ends_the_job_and_ranks_see_count_zero(tmp_path):
    marker = tmp_path / "crashed"
    done = dslaunch("--num_gpus", "2", RANKS, "crash-once", "1", str(marker))
    assert done.returncode == 3
    assert "restart" not in "\n".join(launcher_lines(done.stderr))
    marker.unlink()
    done = dslaunch("--num_gpus", "2", "--max_restarts", "1", RANKS, "crash-once", "5", str(marker))
    assert done.returncode == 0, done.stderr
    assert '"DSLAUNCH_RESTART_COUNT": "0"' in done.stdout and '"TORCHELASTIC_RESTART_COUNT": "0"' in done.stdout


def test_sigint_during_the_restarts_exits_130_with_nothing_left():
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "--num_gpus", "2", "--max_restarts", "50",
                             RANKS, "crash-always", "0", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT)
    seen = ""
    end = time.time() + 60
    while time.time() < end and "restart 1/50" not in seen:
        seen += proc.stderr.readline()
    assert "restart 1/50" in seen
    children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, seen + err
    # gone the moment dslaunch returned: it reaps every rank it stopped before it exits
    alive = [p for p in children if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == []
    assert "restart(s) used" in err


def test_dry_run_shows_the_restart_policy():
    done = dslaunch("--num_gpus", "2", "--max_restarts", "3", "--min_nodes", "2", "--dry-run", RANKS, "nap", "1")
    assert done.returncode == 0, done.stderr
    assert "restarts: up to 3 after a failed rank or a lost node; a lost node is dropped while at least 2" \
        in done.stdout
    doc = json.loads(dslaunch("--num_gpus", "2", "--max-restarts", "3", "--dry-run", "--json",
                              RANKS, "nap", "1").stdout)
    assert doc["restarts"] == {"max_restarts": 3, "min_nodes": None}
    plain = dslaunch("--num_gpus", "2", "--dry-run", RANKS, "nap", "1")
    assert "restarts: none" in plain.stdout

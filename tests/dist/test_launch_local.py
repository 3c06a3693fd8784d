"""Real launches on this machine through the real CLI: all-reduce, failures, signals."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANKS = os.path.join(ROOT, "tests", "scripts", "ranks.py")


def dslaunch(*args, timeout=90, **kw):
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, **kw)


def start(*args):
    return subprocess.Popen([sys.executable, "-m", "launcher", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)


def rank_pids(output):
    return [int(m.group(1)) for m in re.finditer(r"\] pid (\d+) rank", output)]


def wait_for_pids(proc, count, deadline=30):
    lines = []
    end = time.time() + deadline
    while time.time() < end and len(rank_pids("\n".join(lines))) < count:
        lines.append(proc.stdout.readline())
    return rank_pids("\n".join(lines))


def test_gloo_all_reduce_on_three_cpu_ranks():
    # a free port (--master_port 0): the default 29500 may be another job's on a shared machine
    done = dslaunch("--num_gpus", "3", "--master_port", "0", "examples/hello_dist.py")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if "all_reduce sum = 6 (expected 6)" in line]
    assert sorted(line.split()[0:2][1] for line in lines) == ["0]", "1]", "2]"]


def test_tricky_arguments_arrive_verbatim():
    tricky = ["a b", "it's", 'say "hi"', "$HOME", "x;y", "*", "", "--flag=1 2", "\\n"]
    done = dslaunch("--num_gpus", "2", RANKS, "echo-args", *tricky)
    assert done.returncode == 0, done.stderr
    argv_lines = [json.loads(line.split("ARGS ", 1)[1]) for line in done.stdout.splitlines() if "ARGS " in line]
    assert len(argv_lines) == 2
    for argv in argv_lines:
        assert argv[0].startswith("--local_rank=") and argv[1:] == ["echo-args", *tricky]


def test_rank_env_and_local_interface():
    done = dslaunch("--num_gpus", "2", "--env", "DSL_TEST_ENV=a b$c", RANKS, "echo-args")
    envs = sorted((json.loads(line.split("ENV ", 1)[1]) for line in done.stdout.splitlines() if "ENV " in line),
                  key=lambda e: e["RANK"])
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"], e["CUDA_VISIBLE_DEVICES"]) for e in envs] == \
        [("0", "0", "2", "0,1"), ("1", "1", "2", "0,1")]
    assert envs[0]["MASTER_ADDR"] == "127.0.0.1" and envs[0]["GLOO_SOCKET_IFNAME"] == "lo"
    assert envs[0]["DSL_TEST_ENV"] == "a b$c"


def test_first_failure_stops_the_rest_and_leaves_nothing(tmp_path):
    proc = start("--num_gpus", "3", RANKS, "fail", "1", "7", str(tmp_path))   # rank 1 fails once all 3 started
    out, err = proc.communicate(timeout=150)
    assert proc.returncode == 7
    assert "rank 1 on localhost exited with code 7" in err and "failing on purpose" in err
    assert "slept 60 s unstopped" not in out     # ranks 0 and 2 were stopped, not left to finish
    pids = rank_pids(out)
    assert len(pids) == 3
    # gone the moment dslaunch returned: it reaps every rank it stopped before it exits
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_rank_killed_by_sigkill_is_reported_as_oom_hint():
    done = dslaunch("--num_gpus", "2", RANKS, "kill9", "0")
    assert done.returncode == 128 + 9
    assert "killed (SIGKILL): often the host ran out of memory" in done.stderr


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_reaches_every_rank(signum, code):
    proc = start("--num_gpus", "2", RANKS, "sleep")
    pids = wait_for_pids(proc, 2)
    assert len(pids) == 2
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    if signum == signal.SIGINT:
        assert out.count("interrupted") == 2  # the ranks saw SIGINT themselves
    assert not [p for p in pids if psutil.pid_exists(p)]


@pytest.mark.timing
def test_sigkill_of_dslaunch_takes_the_ranks_with_it():
    proc = start("--num_gpus", "2", RANKS, "sleep")
    pids = wait_for_pids(proc, 2)
    assert len(pids) == 2
    proc.kill()
    proc.wait()
    # the kernel sends each rank SIGKILL as dslaunch dies (PR_SET_PDEATHSIG); they end a moment
    # later. 30 s is only a limit for "never": the ranks would sleep 60 s by themselves
    alive = pids
    deadline = time.monotonic() + 30
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == []


def test_log_dir_gets_one_file_per_rank(tmp_path):
    done = dslaunch("--num_gpus", "2", "--log_dir", str(tmp_path), RANKS, "echo-args", "x")
    assert done.returncode == 0
    assert sorted(os.listdir(tmp_path)) == ["rank_0.log", "rank_1.log"]
    assert "ARGS" in (tmp_path / "rank_1.log").read_text()


def test_hostfile_naming_this_machine_twice_runs_both_nodes(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=1\n127.0.0.1 slots=2\n")
    done = dslaunch("-H", str(hosts), "--master_port", "0", "examples/hello_dist.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("all_reduce sum = 6 (expected 6)") == 3


def test_bind_cores_to_rank_gives_each_local_rank_its_share():
    done = dslaunch("--num_gpus", "2", "--bind_cores_to_rank", RANKS, "affinity")
    assert done.returncode == 0, done.stderr
    found = {r["local_rank"]: r for r in (json.loads(line.split("AFFINITY ", 1)[1])
                                         for line in done.stdout.splitlines() if "AFFINITY " in line)}
    cores = sorted(os.sched_getaffinity(0))
    per = max(1, len(cores) // 2)
    for local_rank in (0, 1):
        want = cores[local_rank * per:(local_rank + 1) * per] if len(cores) >= 2 else cores
        assert found[local_rank]["cores"] == want and found[local_rank]["omp"] == str(len(want))
    unbound = dslaunch("--num_gpus", "2", RANKS, "affinity")
    assert all(json.loads(line.split("AFFINITY ", 1)[1])["cores"] == cores
               for line in unbound.stdout.splitlines() if "AFFINITY " in line)

"""--max_restarts and --min_nodes on the real test cluster (real sshd, ssh and pdsh runners)."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANKS = os.path.join(ROOT, "tests", "scripts", "ranks.py")

pytestmark = pytest.mark.cluster


def dslaunch(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def launch(argv, seconds, **kwargs):
    """dslaunch started with its output piped, stopped if it runs past ``seconds`` (SIGTERM, which tears
    its ranks down on every node; SIGKILL 20 s later). A job that hangs then fails its test with
    dslaunch's own stderr, where pytest-timeout would show only the test's frame, and leaves no job
    behind holding the nodes' master port for the tests after it (the preflight of the next job would
    refuse the port: one hang would fail them all)."""
    proc = subprocess.Popen([sys.executable, "-m", "launcher", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, **kwargs)

    def stop():
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    timer = threading.Timer(seconds, stop)
    timer.daemon = True
    timer.start()
    return proc


@pytest.mark.parametrize("launcher", ["ssh", "pdsh"])
def test_a_remote_rank_that_crashes_once_is_restarted_on_every_node(cluster_hostfile, tmp_path, launcher):
    marker = tmp_path / "crashed"
    done = dslaunch("-H", str(cluster_hostfile(2)), "--launcher", launcher, "--max_restarts", "1",
                    RANKS, "crash-once", "3", str(marker))
    assert done.returncode == 0, done.stderr
    restart = [line for line in done.stderr.splitlines() if "restart 1/1:" in line]
    assert len(restart) == 1 and "rank 3 on node2" in restart[0] and "code 3" in restart[0], done.stderr
    assert done.stdout.count('"DSLAUNCH_RESTART_COUNT": "1"') == 4
    assert "1 of 1 restart(s) used" in done.stderr


def test_a_remote_rank_that_crashes_every_time_exits_with_its_code(cluster_hostfile):
    done = dslaunch("-H", str(cluster_hostfile(2)), "--launcher", "ssh", "--no-preflight", "--max_restarts", "2",
                    RANKS, "crash-always", "2", "6")
    assert done.returncode == 6, done.stderr
    assert "no restart left" in done.stderr and "2 of 2 restart(s) used" in done.stderr


def test_a_cut_node_is_dropped_and_the_job_finishes_on_the_two_left(cluster_hostfile, healthy_cluster):
    proc = launch(["-H", str(cluster_hostfile(3)), "--launcher", "ssh", "--heartbeat_timeout", "3",
                   "--max_restarts", "1", "--min_nodes", "2", RANKS, "first-try-sleeps"], 200)
    seen = []
    while len([line for line in seen if "TRY 0" in line]) < 6:
        seen.append(proc.stdout.readline())
        assert seen[-1], "the first try did not start 6 ranks: " + proc.stderr.read()
    healthy_cluster.cut(3)
    cut_at = time.monotonic()
    try:
        first_on_survivors = None
        while True:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "TRY 1" in line and first_on_survivors is None:
                first_on_survivors = time.monotonic() - cut_at
        _out, err = proc.communicate(timeout=120)
    finally:
        healthy_cluster.heal(3)
    assert proc.returncode == 0, err
    second = [line for line in seen if "TRY 1" in line]
    assert len(second) == 4
    assert {re.search(r"WORLD (\d+)", line).group(1) for line in second} == {"4"}
    assert {re.search(r"NODE (\d+)", line).group(1) for line in second} == {"0", "1"}
    assert {re.search(r"MASTER (\S+)", line).group(1) for line in second} == {"10.213.0.1"}
    restart = [line for line in err.splitlines() if "restart 1/1:" in line]
    assert len(restart) == 1 and "node 2 (node3) lost" in restart[0], err
    assert "2 remaining node(s), world size 4" in restart[0]
    assert err.count("preflight ok") == 2, err  # the checks ran again, on the survivors
    print(f"cut -> first rank line on the survivors: {first_on_survivors:.1f} s")


WORKER = os.path.join(ROOT, "tests", "dist", "workers", "elastic_worker.py")
LAST = 7


def train(hostfile, folder, *flags, cut=None, cluster=None, at_step_3=None):
    """The elastic worker on the cluster (12 samples a step, a checkpoint every 2 steps); with `cut`,
    node `cut`'s link is cut after step 3 of the first try (or `at_step_3()` is called then). Returns
    (rank-0 lines, stderr, seconds from the cut to the first step on the survivors)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = launch(["-H", str(hostfile), "--launcher", "ssh", "--heartbeat_timeout", "3", "--no_local_rank",
                   "--env", "ELASTIC_TBS=12", "--env", "ELASTIC_STEP_SLEEP=1.0", *flags, WORKER, str(folder),
                   str(LAST + 1), str(LAST)], 120, env=env)   # a run takes 30-60 s; two fit pytest's 300
    lines, cut_at, first_after, everything = [], None, None, []
    try:
        for line in proc.stdout:
            everything.append(line)
            if line.startswith("[rank 0] "):
                lines.append(line[9:].rstrip("\n"))
            if (cut or at_step_3) is not None and cut_at is None and line.startswith("[rank 0] STEP 3 TRY 0"):
                cluster.cut(cut) if at_step_3 is None else at_step_3()
                cut_at = time.monotonic()
            if cut_at is not None and first_after is None and " TRY 1 " in line and "STEP" in line:
                first_after = time.monotonic() - cut_at
        _out, err = proc.communicate(timeout=180)
    finally:
        if cut is not None:
            cluster.heal(cut)
    assert proc.returncode == 0, err + "".join(everything[-30:])
    return lines, err, first_after


def steps_of(lines, attempt):
    return [int(line.split()[1]) for line in lines if line.startswith("STEP") and f"TRY {attempt} " in line]


def test_a_training_job_loses_node_3_and_finishes_on_two_with_the_same_weights(cluster_hostfile, healthy_cluster,
                                                                               tmp_path):
    import json
    hosts = cluster_hostfile(3)
    plain, _err, _ = train(hosts, tmp_path / "plain")
    cut, err, to_first_step = train(hosts, tmp_path / "cut", "--max_restarts", "1", "--min_nodes", "2",
                                    cut=3, cluster=healthy_cluster)
    assert "restart 1/1: node 2 (node3) lost" in err and "world size 4" in err, err
    assert {line.split()[-1] for line in cut if line.startswith("STEP") and "TRY 1 " in line} == {"4"}
    first_try, second_try = steps_of(cut, 0), steps_of(cut, 1)
    assert second_try[-1] == LAST and second_try == list(range(second_try[0], LAST + 1))
    resumed_from = second_try[0] - 1
    assert resumed_from % 2 == 0 and resumed_from >= 2   # the last checkpoint before the cut
    repeated = max(first_try) - resumed_from
    result = json.loads(next(line for line in reversed(cut) if line.startswith("RESULT "))[7:])
    reference_run = json.loads(next(line for line in reversed(plain) if line.startswith("RESULT "))[7:])
    assert [s["gas"] for s in result["steps"]] == [3] * len(second_try)   # 12 = 1 x 3 x 4 ranks
    assert {s["gas"] for s in reference_run["steps"]} == {2}               # 12 = 1 x 2 x 6 ranks
    sys.path.insert(0, os.path.join(ROOT, "tests", "dist"))
    from test_elastic_resume import close, global_batches, reference
    batches = global_batches(LAST, train_batch_size=12)
    assert [s["ids"] for s in reference_run["steps"]] == [b["ids"] for b in batches]
    assert [s["ids"] for s in result["steps"]] == [b["ids"] for b in batches[resumed_from:]]
    _losses, single = reference(batches)
    assert close(result["weights"], reference_run["weights"])
    assert close(result["weights"], single)
    print(f"node 3 cut after step 3: first step on the 2 survivors {to_first_step:.1f} s later; "
          f"steps repeated: {repeated} (resumed from step {resumed_from}, first try reached {max(first_try)})")


def test_sigint_during_the_restarts_exits_130_and_leaves_nothing_on_any_node(cluster_hostfile, tmp_path):
    import psutil
    marker = f"sigint-marker-{time.time()}"
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "-H", str(cluster_hostfile(2)), "--launcher", "ssh",
                             "--no-preflight", "--max_restarts", "50", RANKS, "crash-always", "3", "4", marker],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    seen = ""
    end = time.time() + 90
    while time.time() < end and "restart 2/50" not in seen:
        seen += proc.stderr.readline()
    assert "restart 2/50" in seen, seen
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, seen + err
    # the moment dslaunch returned: each agent reaps its ranks before it reports "done" (the
    # namespaces share this pid space, so a rank left on any node would show here)
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
    assert left == []


def _start_first_try_sleeps(hostfile, *flags, launcher="ssh"):
    """The 3-node first-try-sleeps job; returns (proc, lines seen, pid of rank 4 on node3)."""
    proc = launch(["-H", str(hostfile), "--launcher", launcher, "--heartbeat_timeout", "3", *flags, RANKS,
                   "first-try-sleeps"], 200)
    seen, rank4 = [], None
    while len([line for line in seen if "TRY 0" in line]) < 6 or rank4 is None:
        seen.append(proc.stdout.readline())
        assert seen[-1], "the first try did not start 6 ranks: " + proc.stderr.read()
        found = re.search(r"\[rank 4\] pid (\d+) rank 4", seen[-1])
        rank4 = int(found.group(1)) if found else rank4
    return proc, seen, rank4


def _second_try(proc, seen):
    out, err = proc.communicate(timeout=120)
    seen += out.splitlines()
    return [line for line in seen if "TRY 1" in line], err


def test_a_node_whose_agent_is_killed_is_dropped_and_the_job_finishes_on_the_two_left(cluster_hostfile):
    import psutil
    proc, seen, rank4 = _start_first_try_sleeps(cluster_hostfile(3), "--max_restarts", "1", "--min_nodes", "2")
    agent = psutil.Process(rank4).parent()   # the namespaces share this pid space
    assert "launcher.agent" in " ".join(agent.cmdline())
    agent.kill()
    second, err = _second_try(proc, seen)
    assert proc.returncode == 0, err
    assert len(second) == 4 and {re.search(r"NODE (\d+)", line).group(1) for line in second} == {"0", "1"}
    assert {re.search(r"WORLD (\d+)", line).group(1) for line in second} == {"4"}
    restart = [line for line in err.splitlines() if "restart 1/1:" in line]
    assert len(restart) == 1 and "node 2 (node3) lost (agent died)" in restart[0], err
    assert "1 of 1 restart(s) used; node(s) lost: node3 (agent died, try 0)" in err


@pytest.mark.parametrize("launcher", ["ssh", "pdsh"])
def test_a_node_whose_sshd_is_gone_is_dropped_at_the_restart_without_using_one(cluster_hostfile, healthy_cluster,
                                                                                launcher):
    proc, seen, rank4 = _start_first_try_sleeps(cluster_hostfile(3), "--max_restarts", "1", "--min_nodes", "2",
                                                launcher=launcher)
    try:
        healthy_cluster.stop(3)            # its running session stays; no new ssh gets in
        os.kill(rank4, signal.SIGKILL)     # the first try fails on node3; the restart cannot reach it
        second, err = _second_try(proc, seen)
    finally:
        healthy_cluster.start(3)
    assert proc.returncode == 0, err
    assert len(second) == 4 and {re.search(r"NODE (\d+)", line).group(1) for line in second} == {"0", "1"}
    restart = [line for line in err.splitlines() if "restart 1/1:" in line]
    assert len(restart) == 1 and "rank 4 on node3" in restart[0], err
    unreachable = [line for line in err.splitlines() if "unreachable at restart: node3 (" in line]
    assert len(unreachable) == 1 and unreachable[0].endswith("(no restart used)"), err
    assert "2 remaining node(s), world size 4" in unreachable[0]
    assert "1 of 1 restart(s) used; node(s) lost: node3 (unreachable, " in err


def test_a_standby_host_takes_the_place_of_node_3_whose_agent_died(cluster_hostfile, healthy_cluster, tmp_path):
    import psutil
    if healthy_cluster.nodes < 4:   # the session's cluster has 3: make the spare (node1..3 are made anew)
        healthy_cluster.script("up", "4")
    spares = tmp_path / "spares"
    spares.write_text("node4 slots=2\n")
    proc, seen, rank4 = _start_first_try_sleeps(cluster_hostfile(3), "--max_restarts", "1",
                                                "--standby_hosts", str(spares))
    psutil.Process(rank4).parent().kill()
    second, err = _second_try(proc, seen)
    assert proc.returncode == 0, err
    assert len(second) == 6 and {re.search(r"WORLD (\d+)", line).group(1) for line in second} == {"6"}
    assert {re.search(r"NODE (\d+)", line).group(1) for line in second} == {"0", "1", "2"}
    restart = [line for line in err.splitlines() if "restart 1/1:" in line]
    assert len(restart) == 1 and "node 2 (node3) lost (agent died)" in restart[0], err
    assert "restarting on 3 node(s) with standby node4, world size 6" in restart[0]
    assert err.count("preflight ok: 3 node(s)") == 2, err   # the checks ran again, the spare's included


def test_a_training_job_whose_node_3_agent_dies_finishes_on_two_with_the_reference_weights(cluster_hostfile,
                                                                                          tmp_path):
    import json
    import psutil
    marker = f"DSL_TEST_JOB={time.time()}"

    def kill_node3_agent():
        rank4 = next(p for p in psutil.process_iter() if _environ_has(p, marker, "RANK=4"))
        agent = rank4.parent()
        assert "launcher.agent" in " ".join(agent.cmdline())
        agent.kill()
    cut, err, to_first_step = train(cluster_hostfile(3), tmp_path / "killed", "--max_restarts", "1",
                                    "--min_nodes", "2", "--env", marker, at_step_3=kill_node3_agent)
    assert "restart 1/1: node 2 (node3) lost (agent died)" in err and "world size 4" in err, err
    assert "node(s) lost: node3 (agent died, try 0)" in err
    second_try = steps_of(cut, 1)
    assert second_try[-1] == LAST and second_try == list(range(second_try[0], LAST + 1))
    resumed_from = second_try[0] - 1
    result = json.loads(next(line for line in reversed(cut) if line.startswith("RESULT "))[7:])
    assert [s["gas"] for s in result["steps"]] == [3] * len(second_try)
    sys.path.insert(0, os.path.join(ROOT, "tests", "dist"))
    from test_elastic_resume import close, global_batches, reference
    batches = global_batches(LAST, train_batch_size=12)
    assert [s["ids"] for s in result["steps"]] == [b["ids"] for b in batches[resumed_from:]]
    assert close(result["weights"], reference(batches)[1])
    print(f"node 3's agent killed after step 3: first step on the 2 survivors {to_first_step:.1f} s later; "
          f"steps repeated: {max(steps_of(cut, 0)) - resumed_from} (resumed from step {resumed_from})")


def _environ_has(process, *entries):
    try:
        text = open(f"/proc/{process.pid}/environ", "rb").read().decode("utf-8", "replace").split("\0")
    except OSError:
        return False
    return all(entry in text for entry in entries)

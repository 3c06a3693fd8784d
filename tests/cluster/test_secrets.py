"""Issue 18 on the real test cluster: no key on any command line, a thief's hello gets nothing.

The nodes are network namespaces that share the pid space, so one scan of /proc/*/cmdline
from here sees every process of every node (sshd children, pdsh, orted, agents, ranks). The scans
look at the test's own job only (tests/helpers/job_scope.py): another dslaunch job on this machine,
a chaos run on its own cluster, has agents and keys of its own.
"""
import json
import os
import re
import subprocess
import sys
import time

import psutil
import pytest

from tests.helpers.job_scope import job_agents, job_command_lines

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANKS = os.path.join(ROOT, "tests", "scripts", "ranks.py")
THIEF = os.path.join(ROOT, "tests", "scripts", "thief.py")
TOKEN = "hf_cluster_secret_" + str(os.getpid())
HEX = re.compile(r"[0-9a-f]{32,}")

pytestmark = pytest.mark.cluster


@pytest.fixture
def hosts(healthy_cluster, tmp_path):
    return str(healthy_cluster.hostfile(tmp_path / "hosts", 2))


def start(*args):
    return subprocess.Popen([sys.executable, "-m", "launcher", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "HF_TOKEN": TOKEN})


def wait_for_ranks(proc, count=4):
    pids, end = [], time.time() + 60
    while time.time() < end and len(pids) < count:
        match = re.search(r"\] pid (\d+) rank", proc.stdout.readline())
        if match:
            pids.append(int(match.group(1)))
    assert len(pids) == count, "the ranks did not start"
    return pids


def environ_of(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as handle:
        items = handle.read().decode("utf-8", "replace").split("\0")
    return dict(item.split("=", 1) for item in items if "=" in item)


def finish(proc):
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.count("rested") == 4, out
    return out, err


@pytest.mark.parametrize("launcher", ["ssh", "pdsh", "openmpi"])
def test_the_key_is_on_no_command_line_on_any_node(hosts, launcher):
    before = {token for argv in job_command_lines(os.getpid()).values() for token in HEX.findall(" ".join(argv))}
    proc = start("-H", hosts, "--launcher", launcher, "--no-preflight", RANKS, "nap", "6")
    try:
        rank_pids = wait_for_ranks(proc)
        lines = job_command_lines(proc.pid)
        found = job_agents(proc.pid, lines)
        assert len(found) == 2, found
        keys = {environ_of(pid).get("DSLAUNCH_AGENT_SECRET") for pid in found} - {None}
        assert bool(keys) == (launcher == "openmpi")
        new_hex = {t for argv in lines.values() for t in HEX.findall(" ".join(argv))} - before
        joined = [" ".join(argv) for argv in lines.values()]
        assert not [line for line in joined if TOKEN in line or any(k in line for k in keys)]
        if launcher == "pdsh":  # the one-time ticket, and nothing else
            tickets = {argv[argv.index("--ticket") + 1] for argv in found.values()}
            assert len(tickets) == 1 and new_hex <= tickets, new_hex
        else:
            assert new_hex == set(), f"a key-like value on a command line: {new_hex}"
            assert all("--secret" in argv for argv in found.values())
        assert all("DSLAUNCH_AGENT_SECRET" not in environ_of(pid) for pid in rank_pids)
        listening = {c.laddr.ip for c in psutil.Process(proc.pid).net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN}
        assert listening == {"10.213.0.254"}, "dslaunch listens beyond the interface toward the nodes"
    finally:
        out, err = finish(proc)
    assert TOKEN not in out + err


@pytest.mark.parametrize("launcher", ["ssh", "pdsh"])
def test_a_thief_with_the_agents_command_line_gets_nothing(hosts, launcher):
    """Another user reads node 1's agent argv and says hello as node 0 and 1, from node 1 and from here."""
    proc = start("-H", hosts, "--launcher", launcher, RANKS, "nap", "8")   # with the preflight
    try:
        wait_for_ranks(proc)
        argv = next(a for a in job_agents(proc.pid).values() if a[a.index("--node-rank") + 1] == "1")
        stolen = json.dumps(argv)
        attempts = [["ip", "netns", "exec", "dsl-n2", sys.executable, THIEF, stolen, "1"],
                    ["ip", "netns", "exec", "dsl-n2", sys.executable, THIEF, stolen, "0"],
                    [sys.executable, THIEF, stolen, "1"]]
        for attempt in attempts:
            got = subprocess.run(attempt, capture_output=True, text=True, timeout=30)
            assert got.returncode == 0, got.stderr
            assert json.loads(got.stdout) == ["challenge"], "the thief received more than a challenge"
    finally:
        out, err = finish(proc)
    refusals = re.findall(r"refused a connection from (\S+):\d+: (.*); the job goes on", err)
    assert [source for source, _ in refusals] == ["10.213.0.2", "10.213.0.2", "10.213.0.254"], err
    assert "rank 0 exited" not in err and TOKEN not in out + err


def test_check_reports_show_no_secret_value(hosts):
    for extra in ([], ["--json"]):
        done = subprocess.run([sys.executable, "-m", "launcher", "-H", hosts, "--check", "--env",
                               f"WANDB_API_KEY={TOKEN}-w", *extra, RANKS], capture_output=True, text=True,
                              cwd=ROOT, timeout=120, env={**os.environ, "HF_TOKEN": TOKEN})
        assert done.returncode == 0, done.stdout + done.stderr
        assert TOKEN not in done.stdout + done.stderr


def test_a_failing_remote_ranks_report_shows_no_value(hosts, tmp_path):
    """The rank prints its HF_TOKEN (forwarded to the nodes) and fails: dslaunch's report hides it."""
    script = tmp_path / "leak.py"   # the nodes share this filesystem
    script.write_text("import os, sys\nif os.environ['RANK'] == '3':\n"
                      "    print('using', os.environ['HF_TOKEN'], flush=True)\n    sys.exit(3)\n")
    argv = [sys.executable, "-m", "launcher", "-H", hosts, "--launcher", "ssh", "--no-preflight", str(script)]
    env = {**os.environ, "HF_TOKEN": TOKEN}
    hidden = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)
    assert hidden.returncode == 3, hidden.stderr
    assert "rank 3 on node2 exited with code 3" in hidden.stderr and "using <redacted>" in hidden.stderr
    assert TOKEN not in hidden.stdout + hidden.stderr
    shown = subprocess.run(argv[:3] + ["--show-secrets"] + argv[3:], capture_output=True, text=True, cwd=ROOT,
                           timeout=120, env=env)
    assert shown.returncode == 3 and f"using {TOKEN}" in shown.stderr, shown.stderr

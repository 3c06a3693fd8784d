"""Process trees on this machine: every descendant found from the tree's own /proc entries, all stopped fast."""
import os
import re
import subprocess
import sys
import time

import psutil
import pytest

from launcher.node.process import process_tree, stop_processes

# A rank that starts 3 children, each with 2 grandchildren (one from a second thread), then
# prints every pid. With "stubborn" every process ignores SIGTERM.
LEAF = """import signal, sys, time
if sys.argv[1] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(flush=True)
time.sleep(60)
"""
MIDDLE = """import signal, subprocess, sys, threading, time
if sys.argv[1] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
def start():
    leaf = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1]], stdout=subprocess.PIPE)
    leaf.stdout.readline()
    return leaf.pid
pids = [start()]
thread = threading.Thread(target=lambda: pids.append(start()))
thread.start()
thread.join()
print(*pids, flush=True)
time.sleep(60)
"""
ROOT = """import os, signal, subprocess, sys, time
if sys.argv[1] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
middles = [subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1], sys.argv[3]], stdout=subprocess.PIPE)
           for _ in range(3)]
pids = [os.getpid()] + [m.pid for m in middles]
for m in middles:
    pids += [int(p) for p in m.stdout.readline().split()]
print("pids", *pids, flush=True)
time.sleep(60)
"""


def start_tree(how):
    popen = subprocess.Popen([sys.executable, "-c", ROOT, how, MIDDLE, LEAF], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    line = popen.stdout.readline()
    assert line.startswith("pids "), line
    return popen, [int(p) for p in line.split()[1:]]


def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def trees():
    started = []
    yield lambda how, n=1: started.extend(start_tree(how) for _ in range(n)) or started[-n:]
    for popen, pids in started:
        for pid in pids:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        popen.wait()


class ProcReads:
    """Which other processes' /proc entries a call touched (the 'open' and 'os.listdir' audit events)."""

    def __init__(self):
        self.paths = []
        self.on = False
        sys.addaudithook(self._hook)   # hooks cannot be removed: this one is off outside `watch`

    def _hook(self, event, args):
        if self.on and event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], str):
            if args[0].startswith("/proc"):
                self.paths.append(args[0])

    def outside(self, pids):
        mine = {str(p) for p in pids} | {"self", "thread-self", str(os.getpid())}
        return [p for p in self.paths if (m := re.match(r"/proc/?([^/]*)", p)) and m.group(1) not in mine]


@pytest.mark.skipif(not os.path.exists(f"/proc/self/task/{os.getpid()}/children"), reason="needs /proc/PID/task/TID/children (Linux)")
def test_process_tree_finds_every_descendant_from_the_trees_own_proc_entries(trees):
    [(popen, pids)] = trees("plain")
    assert len(pids) == 1 + 3 + 6
    reads = ProcReads()
    reads.on = True
    tree = process_tree(popen.pid)
    reads.on = False
    assert sorted(p.pid for p in tree) == sorted(pids) and tree[0].pid == popen.pid
    # no scan of every process on the machine (psutil's children() reads all of /proc/*/stat)
    assert reads.outside(pids) == []


# (how, grace, bound): "plain" trees end on SIGTERM, so the stop never waits its grace out (a grace
# of 30 s makes a wait for it plain); "stubborn" trees wait out one grace for all of them, then
# SIGKILL: one grace is 1 s, four graces one after another at least 4 s
@pytest.mark.timing
@pytest.mark.parametrize("how, grace, bound", [("plain", 30.0, 10.0), ("stubborn", 1.0, 3.0)])
def test_stop_processes_ends_every_process_of_several_trees_together(trees, how, grace, bound):
    started = trees(how, 4)
    popens = [popen for popen, _ in started]
    every = [pid for _, pids in started for pid in pids]
    begun = time.monotonic()
    stop_processes(popens, grace=grace)
    took = time.monotonic() - begun
    assert [p for p in every if alive(p)] == []     # nothing left the moment it returned
    assert all(popen.returncode is not None for popen in popens)
    assert took < bound, f"stopping 4 trees of 10 processes took {took:.2f} s"

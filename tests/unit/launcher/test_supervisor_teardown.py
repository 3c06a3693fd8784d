"""A node's teardown: the other ranks stop before a failed rank's output is drained, the wait for
output is one for all ranks, and a rank that outlives SIGKILL is reported, not waited for."""

import os
import signal
import subprocess
import sys
import time

import pytest

from launcher.node.process import RankProcess, RankSpec, spawn
from launcher.node.supervisor import NodeHooks, NodeSettings, Supervisor


def specs_for(code, count, tmp_path):
    return [RankSpec(rank=r, local_rank=r, argv=(sys.executable, "-c", code), env=dict(os.environ, RANK=str(r)),
                     cwd=str(tmp_path)) for r in range(count)]


# rank 0 says why it fails and exits at once (as a config error found after the rendezvous does);
# rank 1 would live on (in a real job: to fail on the store rank 0 took with it, with a traceback)
FAILS_FIRST = ("import os, sys, time\n"
               "if os.environ['RANK'] == '0':\n"
               "    print('config error: unknown key', file=sys.stderr, flush=True)\n"
               "    sys.exit(2)\n"
               "time.sleep(60)\n")


def test_the_other_ranks_are_stopped_before_the_failed_ranks_exit_is_reported(tmp_path):
    events = []
    supervisor = None

    def peer_running():
        return supervisor.procs[1].popen.poll() is None

    def on_failure(failed):
        events.append(("failing", failed.rank, failed.returncode, "peer running" if peer_running() else "peer gone"))

    def on_exit(done):
        events.append(("exit", done.rank, done.returncode, "peer running" if peer_running() else "peer gone"))
    supervisor = Supervisor(specs_for(FAILS_FIRST, 2, tmp_path),
                            NodeHooks(on_output=lambda line: None, on_exit=on_exit, on_failure=on_failure),
                            NodeSettings(grace=5.0))
    supervisor.start()
    result = supervisor.run()
    assert events == [("failing", 0, 2, "peer running"),      # told at once (the agent tells dslaunch)
                      ("exit", 0, 2, "peer gone"),            # its output drained only after rank 1 stopped
                      ("exit", 1, -signal.SIGTERM, "peer gone")]
    assert result.first_failure.rank == 0      # one failure for the job: rank 1 was stopped, not failed
    assert result.first_failure.tail == ("config error: unknown key",)


# Each rank leaves a grandchild outside its process tree (sh forks it and exits) that keeps the
# rank's stdout and stderr open, so its output threads never see EOF; rank 0 then fails.
STAY = ("import os, subprocess, sys, time\n"
        "subprocess.run(['sh', '-c', 'sleep 20 &'])\n"
        "print('up', flush=True)\n"
        "time.sleep(0.8)\n"
        "sys.exit(3) if os.environ['RANK'] == '0' else time.sleep(30)\n")


@pytest.mark.timing
def test_teardown_of_eight_ranks_with_escaped_pipes_takes_one_wait_not_eight(tmp_path):
    reported = {}

    def on_exit(done):
        reported.setdefault("failure", time.monotonic())
        reported.setdefault("ranks", []).append(done.rank)
    supervisor = Supervisor(specs_for(STAY, 8, tmp_path), NodeHooks(on_output=lambda line: None, on_exit=on_exit),
                            NodeSettings(grace=1.0))
    supervisor.start()
    result = supervisor.run()
    after_failure = time.monotonic() - reported["failure"]
    assert result.first_failure is not None and result.first_failure.rank == 0
    assert sorted(reported["ranks"]) == list(range(8))
    # from rank 0's report to the end: one 0.5 s wait for the seven stopped ranks' output, where
    # a wait per rank takes 3.5 s at least
    assert after_failure < 3.0, f"the seven stopped ranks took {after_failure:.1f} s to report"


class SurvivesSigkill:
    """A rank's Popen whose process outlives SIGKILL, as one in uninterruptible sleep (a hung NFS
    mount, a wedged driver) does: poll() never sees it end and no wait ever returns."""

    pid = 2 ** 31 - 1   # no such process: the tree walk finds nothing to signal

    def __init__(self):
        self.killed = False

    def poll(self):
        return None

    def kill(self):
        self.killed = True

    def wait(self, timeout=None):
        if timeout is None:
            raise AssertionError("wait() without a timeout on a process that never ends: dslaunch would hang")
        raise subprocess.TimeoutExpired("rank", timeout)


def test_a_rank_that_outlives_sigkill_is_reported_not_waited_for(tmp_path):
    stuck = SurvivesSigkill()

    def spawner(spec, on_output, log):
        return RankProcess(spec=spec, popen=stuck) if spec.rank == 1 else spawn(spec, on_output, log)
    exits = []
    supervisor = Supervisor(specs_for(FAILS_FIRST, 2, tmp_path),
                            NodeHooks(on_output=lambda line: None, on_exit=exits.append),
                            NodeSettings(grace=0.1, host="n1"), spawner=spawner)
    supervisor.start()
    result = supervisor.run()
    assert stuck.killed
    assert result.first_failure.rank == 0
    [left] = [e for e in exits if e.rank == 1]
    assert left.stuck_pid == stuck.pid and left.returncode == -signal.SIGKILL
    assert left.describe() == (f"rank 1 on n1 did not end after SIGKILL and was left running as pid {stuck.pid}: "
                               "a process that ignores SIGKILL is stuck in the kernel (often a hung file system "
                               "or device)")

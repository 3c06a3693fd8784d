"""An agent's supervisor under --stall_timeout: it sends its ranks' progress when it changes (not
every poll), carries out dslaunch's request for the stacks (every rank's, then the stuck one
killed and marked as stuck), and its progress folder does not outlive it."""
import os
import signal
import subprocess
import sys
import threading

from launcher.node.process import RankSpec, spawn
from launcher.node.stall import PROGRESS_PREFIX
from launcher.node.supervisor import NodeHooks, NodeSettings, Supervisor

# writes its progress once (5 events, step 2), then hangs (its stack dump is armed by the launcher's bootstrap)
RANK = ("import os, time\n"
        "with open(os.environ['DSLAUNCH_PROGRESS_FILE'], 'w') as f:\n"
        "    f.write('5 2\\n')\n"
        "def hang_here():\n"
        "    while True:\n"
        "        time.sleep(0.1)\n"
        "hang_here()\n")


def test_progress_goes_out_on_change_and_a_stacks_request_dumps_every_rank_then_kills_the_stuck_one(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tmp_path / f"{PROGRESS_PREFIX}{dead.pid}-x"   # a SIGKILLed launcher's folder
    left.mkdir()
    specs = [RankSpec(rank=r, local_rank=r, argv=(sys.executable, "-c", RANK), env=dict(os.environ),
                      cwd=str(tmp_path)) for r in (4, 5)]
    sent, lines, exits = [], [], {}
    supervisor = None

    def on_progress(readings, _lines):
        sent.append(sorted(readings))
        if len(sent) == 1:   # dslaunch would ask once the others had been past rank 5 for the timeout
            threading.Timer(1.5, supervisor.request_stacks, args=(5, 42.0)).start()

    supervisor = Supervisor(specs, NodeHooks(on_output=lambda event: lines.append((event.rank, event.line)),
                                             on_exit=lambda done: exits.setdefault(done.rank, done),
                                             on_progress=on_progress),
                            NodeSettings(grace=1.0, stall_timeout=30.0, progress_root=str(tmp_path)))
    supervisor.start()
    assert not left.exists()
    mine = [p for p in tmp_path.iterdir() if p.name.startswith(f"{PROGRESS_PREFIX}{os.getpid()}-")]
    assert len(mine) == 1
    result = supervisor.run()
    assert sorted(reading for readings in sent for reading in readings) == [(4, 5, 2), (5, 5, 2)], sent  # no repeats
    assert exits[5].returncode == -signal.SIGKILL and exits[5].stalled_s == 42.0
    assert "was stopped as stuck" in exits[5].describe()
    assert result.first_failure.rank == 5
    for rank in (4, 5):   # every rank's stack, not only the stuck one's
        assert any(rank == r and "in hang_here" in line for r, line in lines), lines
    assert not mine[0].exists()


class Unkillable:
    """A rank's process that SIGKILL does not end (as one in uninterruptible sleep on a hung file system)."""

    def __init__(self, popen):
        self.popen = popen
        self.pid = popen.pid

    def poll(self):
        return None

    def kill(self):
        pass

    def wait(self, timeout=None):
        raise subprocess.TimeoutExpired("rank", timeout)

    def __getattr__(self, name):
        return getattr(self.popen, name)


def test_a_stuck_rank_that_outlives_sigkill_ends_the_job_named_with_its_pid(tmp_path):
    specs = [RankSpec(rank=r, local_rank=r, argv=(sys.executable, "-c", RANK), env=dict(os.environ),
                      cwd=str(tmp_path)) for r in (0, 1)]
    real = []

    def spawner(spec, on_output, log):
        proc = spawn(spec, on_output, log)
        if spec.rank == 1:
            real.append(proc.popen)
            proc.popen = Unkillable(proc.popen)
        return proc

    supervisor = None

    def on_progress(readings, _lines):
        supervisor.request_stacks(1, 30.0)

    supervisor = Supervisor(specs, NodeHooks(on_output=lambda event: None, on_progress=on_progress),
                            NodeSettings(grace=1.0, stall_timeout=30.0, progress_root=str(tmp_path)), spawner=spawner)
    supervisor.start()
    try:
        result = supervisor.run()   # a hang here is the failure: the job waited for a rank that never ends
    finally:
        real[0].kill()
        real[0].wait()
    assert result.first_failure.rank == 1 and result.first_failure.stuck_pid == real[0].pid
    assert "did not end after SIGKILL" in result.first_failure.describe()
    assert {e.rank for e in result.exits} == {0, 1}

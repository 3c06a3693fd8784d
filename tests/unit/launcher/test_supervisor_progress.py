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


# the local runner's own judgement of a quiet job, without torch: rank 0 waits in a function of a file
# under torch/distributed/ (as a collective's frame is), rank 1 sleeps in its loader; each prints a line first
COLLECTIVE = "import time\ndef all_reduce():\n    time.sleep(600)\n"
RANK_WAITS = ("import sys, time\nsys.path.insert(0, sys.argv[1])\nfrom torch.distributed import fake_c10d\n"
              "print('step 0 done', flush=True)\nfake_c10d.all_reduce()\n")
RANK_SLEEPS = ("import time\ndef load_batch():\n    time.sleep(600)\nprint('step 0 done', flush=True)\nload_batch()\n")
RANK_BUSY = ("import time\ndef deeper(depth):\n    time.sleep(0.1)\n    deeper(depth + 1)\n"
             "print('step 0 done', flush=True)\ndeeper(0)\n")


def local_ranks(tmp_path, *codes):
    package = tmp_path / "fake" / "torch" / "distributed"
    package.mkdir(parents=True)
    (package / "fake_c10d.py").write_text(COLLECTIVE)
    for directory in (package.parent, package):
        (directory / "__init__.py").write_text("")
    specs = []
    for rank, code in enumerate(codes):
        (tmp_path / f"rank{rank}.py").write_text(code)
        specs.append(RankSpec(rank=rank, local_rank=rank, argv=(sys.executable, str(tmp_path / f"rank{rank}.py"),
                                                               str(tmp_path / "fake")),
                              env=dict(os.environ), cwd=str(tmp_path)))
    return specs


def run_local(tmp_path, codes, stall_timeout, stop_after=None):
    """Run `codes` as local ranks under the local runner's watch: (what it said, how the node ended)."""
    said = []
    supervisor = Supervisor(local_ranks(tmp_path, *codes), NodeHooks(on_output=lambda event: None, on_stall=said.append),
                            NodeSettings(grace=1.0, stall_timeout=stall_timeout, progress_root=str(tmp_path)))
    supervisor.start()
    if stop_after is not None:
        threading.Timer(stop_after, supervisor.request_stop, args=("test over",)).start()
    return said, supervisor.run()


def test_the_local_runner_names_the_rank_outside_the_collective_of_a_quiet_job_and_stops_it(tmp_path):
    said, result = run_local(tmp_path, (RANK_WAITS, RANK_SLEEPS), stall_timeout=2.0)
    assert len(said) == 1 and said[0].startswith("no rank made progress for 2 s"), said
    assert "likely cause: rank 1 is not in a collective, in load_batch" in said[0]
    assert "rank1.py:3 in load_batch: time.sleep(600)" in said[0]
    assert "waiting in all_reduce: rank 0 (called at" in said[0]
    assert result.first_failure.rank == 1 and result.first_failure.hung_s >= 2.0
    assert "was stopped as hung" in result.first_failure.describe()


def test_a_silent_rank_whose_stack_moves_keeps_the_job_from_being_judged(tmp_path):
    said, result = run_local(tmp_path, (RANK_BUSY, RANK_SLEEPS), stall_timeout=1.0, stop_after=6.0)   # quiet seconds
    assert said == [] and result.stopped_by == "test over", "\n".join(said)

"""A node's teardown waits for its ranks' output once, not once per rank (real processes)."""

import os
import sys
import time

from launcher.node.process import RankSpec
from launcher.node.supervisor import Supervisor

# Each rank leaves a grandchild outside its process tree (sh forks it and exits) that keeps the
# rank's stdout and stderr open, so its output threads never see EOF; rank 0 then fails.
STAY = ("import os, subprocess, sys, time\n"
        "subprocess.run(['sh', '-c', 'sleep 20 &'])\n"
        "print('up', flush=True)\n"
        "time.sleep(0.8)\n"
        "sys.exit(3) if os.environ['RANK'] == '0' else time.sleep(30)\n")


def test_teardown_of_eight_ranks_with_escaped_pipes_takes_one_wait_not_eight(tmp_path):
    specs = [RankSpec(rank=r, local_rank=r, argv=(sys.executable, "-c", STAY),
                      env=dict(os.environ, RANK=str(r)), cwd=str(tmp_path)) for r in range(8)]
    exits = []
    supervisor = Supervisor(specs, on_output=lambda line: None, on_exit=exits.append, grace=1.0)
    supervisor.start()
    started = time.monotonic()
    result = supervisor.run()
    took = time.monotonic() - started
    assert result.first_failure is not None and result.first_failure.rank == 0
    assert sorted(e.rank for e in exits) == list(range(8))
    # rank 0 fails after ~0.8 s (+1 s for its own readers), then one 0.5 s wait for the other seven;
    # one 0.5 s wait per rank would add 3.5 s more
    assert took < 5.0, f"teardown took {took:.1f} s"

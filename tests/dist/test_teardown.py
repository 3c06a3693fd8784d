"""The exit teardown that ``init_distributed`` registers really ends the process group.

``dist.destroy_process_group()`` only drops torch's own references to the group; the gloo
backend (its worker threads, socket loop, and on rank 0 the TCPStore server) ends when the
last reference goes. torch.distributed.nn.functional binds ``group=group.WORLD`` as default
arguments when first imported, and torch imports it lazily at the first optimizer step, after
the group exists: the group then outlived the teardown and was destroyed only during
interpreter finalization, with its threads still running (suspected in rare SIGABRTs at exit).
"""
import json
import os
from pathlib import Path

import pytest

from tests.helpers.world import check, run_world

WORKER = Path(__file__).parent / "workers" / "teardown_worker.py"


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads thread names from /proc")
@pytest.mark.parametrize("who_inits", ["engine", "script-inits"])
def test_no_distributed_thread_survives_exit_teardown(who_inits):
    results = check(run_world(WORKER, 2, *([who_inits] if who_inits != "engine" else []), timeout=180))
    for result in results:
        lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if line.startswith(("RUNNING ", "LEFT ")))
        assert json.loads(lines["RUNNING"]), result.stdout  # the probe sees gloo's threads while they run
        assert json.loads(lines["LEFT"]) == [], (result.rank, result.stdout)

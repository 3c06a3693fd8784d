"""offload_optimizer.ratio against DeepSpeed 0.19.8's recorded losses (tests/data/deepspeed-0.19.8/
partial_offload.json, by scripts/record_deepspeed_losses.py --only partial_offload).

The same DeepSpeed script (tests/dist/workers/partial_offload_worker.py) runs on 2 CPU ranks with
``--engine dslaunch`` (``from launcher import zero as deepspeed``: a real DeepSpeed is installed in this
environment, which ``--as-deepspeed`` refuses): stage 3, fp32, sub_group_size 300, clipping every step.
On a CPU host DeepSpeed's "device" is the CPU too, so its recorded runs show that its config loads and
trains at each ratio like full offload; ours must give each step's loss within the fp32 tolerance of
DeepSpeed's, and the same weights.
"""
import pytest

from tests.helpers.recorded import FP32_TOLERANCE, recorded
from tests.helpers.world import REPO, check, run_world

WORKER = REPO / "tests" / "dist" / "workers" / "partial_offload_worker.py"


@pytest.mark.parametrize("ratio", sorted(recorded("partial_offload")["runs"]))
def test_partial_offload_trains_like_deepspeed(ratio):
    record = recorded("partial_offload")
    want = record["runs"][ratio]
    (rank0,) = [r for r in check(run_world(WORKER, 2, ratio, "--engine", "dslaunch", timeout=240,
                                           env=record["launch"]["env"])) if r.rank == 0]
    (ours,) = rank0.records()
    assert len(ours["losses"]) == len(want["losses"]) == 8
    gap = max(abs(a - b) for a, b in zip(ours["losses"], want["losses"]))
    assert gap <= FP32_TOLERANCE, (ratio, gap, ours["losses"], want["losses"])
    for got, expected in zip(ours["weights"], want["weights"]):
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-5), (ratio, ours["weights"], want["weights"])

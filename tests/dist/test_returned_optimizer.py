"""The optimizer ``deepspeed.initialize`` returns, stepped the ways frameworks step it, against DeepSpeed 0.19.8
(issue 41; recorded by scripts/record_deepspeed_losses.py --only returned_optimizer into
tests/data/deepspeed-0.19.8/returned_optimizer.json).

The loops (tests/dist/workers/returned_optimizer_worker.py): ``optimizer`` is Lightning Fabric's
(engine.backward, then the returned optimizer's step() and zero_grad(), never engine.step());
``lightning`` the Lightning Trainer's (zero_grad() on it between forward and backward, then
engine.step()); ``both`` a script that calls optimizer.step() and then engine.step(); ``engine``
a plain script. Each runs on 2 CPU ranks under ``dslaunch --as-deepspeed``; every step's loss
must be DeepSpeed's, and where DeepSpeed stops with an error this engine stops too, with its own.
"""
import pytest

from tests.helpers.recorded import FP32_TOLERANCE, recorded
from tests.helpers.world import REPO, run_world

WORKER = REPO / "tests" / "dist" / "workers" / "returned_optimizer_worker.py"
CASES = [(0, "optimizer"), (0, "both"), (1, "optimizer"), (1, "both"), (2, "engine"), (2, "optimizer"),
         (2, "both"), (2, "lightning"), (3, "optimizer"), (3, "both"), (3, "lightning")]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("stage,loop", CASES, ids=[f"stage{s}-{loop}" for s, loop in CASES])
def test_the_returned_optimizer_trains_as_deepspeeds(stage, loop):
    record = recorded("returned_optimizer")
    theirs = record["runs"][f"{stage}/{loop}"]
    results = run_world(WORKER, 2, str(stage), loop, timeout=200, env=record["launch"]["env"],
                        launcher_args=("--as-deepspeed", "--no_local_rank"))
    rank0 = results[0]
    if "report" not in theirs:   # DeepSpeed stopped at engine.step() after optimizer.step() (a TypeError)
        assert theirs["error"].endswith("TypeError: 'NoneType' object is not iterable"), theirs
        assert all(r.returncode != 0 for r in results)
        assert "optimizer step error: engine.step(): optimizer.step() already applied these gradients" in rank0.stderr
        return
    assert all(r.returncode == 0 for r in results), "\n".join(r.stderr[-3000:] for r in results)
    (ours,) = rank0.records()
    reference = theirs["report"]
    gaps = [abs(a - b) for a, b in zip(ours["losses"], reference["losses"])]
    assert len(ours["losses"]) == len(reference["losses"]) and max(gaps) <= FP32_TOLERANCE, \
        "per-step loss vs DeepSpeed: " + ", ".join(f"{a:.7f} vs {b:.7f}" for a, b in zip(ours["losses"],
                                                                                         reference["losses"]))
    assert ours["lrs"] == pytest.approx(reference["lrs"])       # the scheduler moves only under engine.step()
    assert ours["global_steps"] == reference["global_steps"]
    assert ours["weights"] == pytest.approx(reference["weights"], rel=1e-5, abs=2e-6)   # recorded to 6 decimals

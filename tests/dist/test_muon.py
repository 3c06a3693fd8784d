"""DeepSpeed 0.19's Muon optimizer against DeepSpeed 0.19.8's recorded runs (issue 41,
tests/data/deepspeed-0.19.8/muon_steps.json, by scripts/record_deepspeed_losses.py --only muon_steps).

The worker's model has matrices (Muon), biases and a layer named ``embed`` (the auxiliary Adam), with
``muon_lr`` and ``adam_lr`` apart, and DeepSpeed's default gradient clip of 1.0: at stage 0 the clip
scales the raw gradients, at stages 1-3 the orthogonalized updates, so the stages' losses differ
(stage 3 with reduce_scatter false, as DeepSpeed requires).
"""
import pytest

from tests.helpers.recorded import recorded
from tests.helpers.world import REPO, check, run_world

WORKER = REPO / "tests" / "dist" / "workers" / "muon_steps_worker.py"
FP32_TOLERANCE = 1e-5


@pytest.mark.parametrize("stage, extra", [(0, ()), (1, ()), (2, ()), (3, ()), (3, ("--persistence", "0"))],
                         ids=["0", "1", "2", "3", "3-partitioned"])
def test_muon_losses_match_deepspeed(stage, extra):
    """Stage 3 as recorded keeps these small matrices whole (persistent); with the persistence
    threshold at 0 they are partitioned, and the losses must not move (DeepSpeed's do not)."""
    record = recorded("muon_steps")
    (rank0,) = [r for r in check(run_world(WORKER, 2, str(stage), *extra, env=record["launch"]["env"], timeout=240,
                                           launcher_args=("--as-deepspeed", "--no_local_rank"))) if r.rank == 0]
    (result,) = rank0.records()
    theirs = record["stages"][str(stage)]
    gaps = [abs(a - b) for a, b in zip(result["losses"], theirs["losses"])]
    print(f"stage {stage} {' '.join(extra)}: max loss difference {max(gaps):.3g}")
    assert len(result["losses"]) == len(theirs["losses"]) == 8
    assert max(gaps) <= FP32_TOLERANCE, f"stage {stage}: ours {result['losses']} vs DeepSpeed's {theirs['losses']}"
    assert result["weights"] == pytest.approx(theirs["weights"], abs=1e-4)

"""Muon's checkpoints resume exactly (issue 41): save after 3 steps, load into a fresh engine, and the
continued losses are the uninterrupted run's, at stages 0-3 on 2 ranks; the same checkpoints load on
1 rank and continue within float rounding (the ranks' gradient sums are added in another order).

Muon's momentum is a matrix's, and a rank's master may cut a matrix anywhere: the checkpoint must
hold it per parameter slice, as Adam's moments are, or a resume at another world size cannot place it.
"""
import pytest
import torch

from tests.helpers.world import REPO, check, run_world

WORKER = REPO / "tests" / "dist" / "workers" / "muon_ckpt_worker.py"
LAUNCH = ("--as-deepspeed", "--no_local_rank")   # the worker borrows the DeepSpeed-style recorded model
STAGES = (0, 1, 2, 3)
RESHARD_TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("muon_ckpt")
    sessions = [f"{mode}:{root / f'stage{stage}'}:{stage}" for stage in STAGES for mode in ("train", "resume")]
    records = check(run_world(WORKER, 2, *sessions, launcher_args=LAUNCH, timeout=300))[0].records()[0]
    return root, {stage: (records[str(2 * i)], records[str(2 * i + 1)]) for i, stage in enumerate(STAGES)}


@pytest.mark.parametrize("stage", STAGES)
def test_resume_on_two_ranks_is_exact(two_ranks, stage):
    _, runs = two_ranks
    straight, resumed = runs[stage]
    assert resumed["first"] == 3
    print(f"stage {stage}: uninterrupted {straight['losses'][3:]}, resumed {resumed['losses']}")
    assert resumed["losses"] == straight["losses"][3:]   # bit for bit


def test_momentum_is_saved_per_parameter_slice(two_ranks):
    root, _ = two_ranks
    for stage in (2, 3):
        _check_momentum_slices(torch.load(root / f"stage{stage}" / "mid" / "rank_1_shard.pt", weights_only=False))


def _check_momentum_slices(shard):
    matrices = [r for r in shard["fragments"] if r["name"] in ("hidden.weight", "out.weight")]
    assert matrices
    for record in matrices:
        assert record["state"]["momentum_buffer"].numel() == record["numel"], record["name"]
        assert "momentum_buffer" not in record["scalars"]


def test_resume_on_one_rank_continues(two_ranks):
    root, runs = two_ranks
    sessions = [f"resume:{root / f'stage{stage}'}:{stage}" for stage in STAGES]
    records = check(run_world(WORKER, 1, *sessions, launcher_args=LAUNCH, timeout=300))[0].records()[0]
    for index, stage in enumerate(STAGES):
        straight, one = runs[stage][0]["losses"][3:], records[str(index)]["losses"]
        gap = max(abs(a - b) for a, b in zip(straight, one))
        print(f"stage {stage}, 2 -> 1 rank: max loss difference {gap:.3g}")
        assert len(one) == len(straight) == 5 and gap <= RESHARD_TOLERANCE, (stage, straight, one)

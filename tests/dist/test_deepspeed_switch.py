"""A running DeepSpeed job switched over to this engine mid-training (issue 41 item 4).

DeepSpeed 0.19.8 ran tests/dist/workers/switch_worker.py for 4 steps and saved a checkpoint, then
continued it to step 8 from that checkpoint (scripts/record_deepspeed_switch.py: the checkpoints are
in tests/data/deepspeed-0.19.8/switch/, the losses in switch.json). Here this engine's
``load_checkpoint`` takes the same folder and continues the run, at the world size DeepSpeed saved
with and at the other one (1 <-> 2 ranks, which DeepSpeed itself cannot do without a conversion);
every step's loss must be the one DeepSpeed's own continuation produced.

fp16 was recorded with DeepSpeed's CPU fp16 check answered yes (its CPU accelerator refuses fp16
without mkldnn's fp16 kernels). There the switch is exact up to the first step at which the loss
scale grows, and the scale follows DeepSpeed's at every step; on a growth step DeepSpeed unscales the
gradients by the grown scale (ZeRO's ``step`` updates the scale first) where this engine divides by
the scale they were computed with, so the steps after differ by that one smaller update.
"""
import json
import shutil

import pytest

from scripts.deepspeed_switch import steps_before_growth
from tests.helpers.recorded import DATA, FP32_TOLERANCE
from tests.helpers.world import REPO, check, run_world

WORKER = REPO / "tests" / "dist" / "workers" / "switch_worker.py"
RECORD = DATA / "switch.json"
# bf16 weights round to 8 bits: two runs whose sums differ in order land one rounding apart (measured below)
BF16_TOLERANCE = 2e-3
# after an fp16 growth step (module docstring; measured 4.5e-3)
FP16_GROWTH_GAP = 0.01
# DeepSpeed 0.19.8 at stage 0 in fp16 does not scale the loss (engine.backward scales it for a ZeRO
# optimizer only) but its FP16_Optimizer still divides the gradients by the scale: its Adam moments
# are 256-512 times too small and its clipping never acts. This engine continues from those moments
# with correctly scaled gradients, so it is not DeepSpeed's trajectory (measured 5.5e-2).
STAGE0_FP16_GAP = 0.08


def recorded_cases() -> list[str]:
    if not RECORD.exists():
        return []
    return sorted(name for name, case in json.loads(RECORD.read_text())["cases"].items() if "resumed" in case)


def tolerance(case: dict) -> float:
    if case["precision"] == "fp32":
        return FP32_TOLERANCE
    # fp16 rounds finer than bf16. At stage 0 DeepSpeed's 16-bit optimizer (FP16_Optimizer) starts with a
    # step on zero gradients, which is what sets it apart (docs/engine/zero.md, Precision); its checkpoint
    # carries that step count, so the switched run steps as DeepSpeed's does
    return BF16_TOLERANCE


def continue_on_this_engine(case: dict, folder, world_size: int, tmp_path, stage: int | None = None) -> dict:
    out = tmp_path / "ours.json"
    stage = case["stage"] if stage is None else stage
    check(run_world(WORKER, world_size, str(stage), case["precision"], "--engine", "dslaunch",
                    "--load", str(folder), "--out", str(out), timeout=150))
    return json.loads(out.read_text())


@pytest.mark.timeout(200)
@pytest.mark.parametrize("other_world_size", [False, True], ids=["same-world-size", "other-world-size"])
@pytest.mark.parametrize("name", recorded_cases())
def test_a_deepspeed_checkpoint_continues_with_deepspeeds_losses(name, other_world_size, tmp_path):
    case = json.loads(RECORD.read_text())["cases"][name]
    world_size = 3 - case["world_size"] if other_world_size else case["world_size"]
    ours = continue_on_this_engine(case, DATA / "switch" / name, world_size, tmp_path)
    theirs = case["resumed"]
    assert ours["loaded"]["global_steps"] == theirs["loaded"]["global_steps"] == 4
    assert ours["loaded"]["global_samples"] == theirs["loaded"]["global_samples"]
    assert ours["loaded"]["client_state"] == theirs["loaded"]["client_state"]
    assert sorted(ours["steps"]) == sorted(theirs["steps"]) == ["4", "5", "6", "7"]
    assert ours["global_steps"] == theirs["global_steps"] == 8
    steps = sorted(theirs["steps"], key=int)
    scales = [(ours["steps"][step]["loss_scale"], theirs["steps"][step]["loss_scale"]) for step in steps]
    assert all(mine == reference for mine, reference in scales), f"{name}: loss scales {scales}"
    lrs = [(ours["steps"][step]["lr"], theirs["steps"][step]["lr"]) for step in steps]
    assert [mine for mine, _ in lrs] == pytest.approx([reference for _, reference in lrs])
    gaps = {step: abs(ours["steps"][step]["loss"] - theirs["steps"][step]["loss"]) for step in steps}
    if case["precision"] == "fp16" and case["stage"] == 0:
        assert max(gaps.values()) <= STAGE0_FP16_GAP, f"{name}: per-step loss gaps {gaps}"
        return
    exact = steps_before_growth(theirs) if case["precision"] == "fp16" else steps
    assert max(gaps[step] for step in exact) <= tolerance(case), f"{name} at {world_size} rank(s): gaps {gaps}"
    assert max(gaps.values()) <= max(tolerance(case), FP16_GROWTH_GAP), f"{name}: per-step loss gaps {gaps}"


def test_the_recorded_continuations_are_deepspeeds_straight_runs():
    """The reference itself: DeepSpeed resumed from its checkpoint trains as it did without stopping."""
    cases = json.loads(RECORD.read_text())["cases"]
    for name in recorded_cases():
        straight, resumed = cases[name]["straight"]["steps"], cases[name]["resumed"]["steps"]
        assert all(resumed[s]["loss"] == pytest.approx(straight[s]["loss"], abs=1e-6) for s in resumed), name


@pytest.mark.timeout(200)
@pytest.mark.parametrize("name,stage,world_size", [("zero1-fp32-ws2", 3, 1), ("zero3-bf16-ws1", 0, 2)])
def test_a_deepspeed_checkpoint_continues_at_another_stage_and_world_size(name, stage, world_size, tmp_path):
    """ZeRO-1 on 2 ranks continued as ZeRO-3 on 1 (and 3 on 1 as 0 on 2): the same losses."""
    case = json.loads(RECORD.read_text())["cases"][name]
    ours = continue_on_this_engine(case, DATA / "switch" / name, world_size, tmp_path, stage=stage)
    theirs = case["resumed"]["steps"]
    gaps = [abs(ours["steps"][step]["loss"] - theirs[step]["loss"]) for step in theirs]
    assert max(gaps) <= tolerance(case), gaps


@pytest.mark.timeout(200)
def test_an_incomplete_deepspeed_folder_fails_every_rank_with_the_missing_file(tmp_path):
    """Rank 0 of 2 would read only saved rank 0's file: it must fail too, not wait for rank 1."""
    folder = tmp_path / "ckpt"
    shutil.copytree(DATA / "switch" / "zero2-fp32-ws2", folder)
    (folder / "global_step4" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    results = run_world(WORKER, 2, "2", "fp32", "--engine", "dslaunch", "--load", str(folder), timeout=150)
    assert all(r.returncode != 0 for r in results)
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt: missing" in results[0].stderr

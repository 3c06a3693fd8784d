"""Pipeline precision (pipe 2 x data 2, gloo): bf16 with fp32 masters tracks fp32; an fp16 overflow
on one stage of one data rank skips that step on every rank and halves the loss scale. Both at ZeRO
stage 0 and stage 1 (fp32 masters stepped as data-axis slices)."""
from pathlib import Path

import pytest

from tests.helpers.world import check, run_world

WORKER = Path(__file__).parent / "workers" / "pipe_precision_worker.py"


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_bf16_pipeline_tracks_the_fp32_reference(zero_stage):
    for result in check(run_world(WORKER, 4, "bf16", str(zero_stage), timeout=240)):
        record = result.records()[0]
        assert record["dtype"] == "torch.bfloat16" and record["sharded"] == (zero_stage == 1)
        # AdamW at lr 0.05 moves every weight ~0.05 a step, so bf16 rounding can flip one step's sign:
        # the weights stay within one step of fp32, the losses within 2 %
        assert record["max_abs_error"] < 0.1, record
        for loss, ref_loss in zip(record["losses"], record["reference_losses"]):
            assert abs(loss - ref_loss) < 0.02 * ref_loss, record
        assert record["skipped"] == [0, 0, 0, 0]


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_fp16_overflow_on_one_stage_skips_the_step_everywhere(zero_stage):
    for result in check(run_world(WORKER, 4, "fp16", str(zero_stage), timeout=240)):
        record = result.records()[0]
        assert record["dtype"] == "torch.float16" and record["sharded"] == (zero_stage == 1)
        assert record["skipped"] == [0, 1, 1, 1], record   # only step 2 (poisoned on rank 0 alone) is skipped
        assert record["scales"][1] == record["scales"][0] / 2, record


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_bf16_tied_weight_stays_one_weight_across_stages(zero_stage):
    """The fp32 masters (and the stage-1 slices) start from the tie's synced weight, not each stage's own init."""
    records = [result.records()[0] for result in check(run_world(WORKER, 4, "bf16", str(zero_stage), "tied",
                                                                 timeout=240))]
    copies = {r["stage"]: r["tied"]["io"] for r in records}
    assert copies[0] == copies[1], records
    assert all(r["max_abs_error"] < 0.1 for r in records), records    # bf16's bound, as above

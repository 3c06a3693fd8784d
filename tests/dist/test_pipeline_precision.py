"""Pipeline precision (pipe 2 x data 2, gloo): bf16 with fp32 masters tracks fp32; an fp16 overflow
on one stage of one data rank skips that step on every rank and halves the loss scale."""
from pathlib import Path

from tests.helpers.world import check, run_world

WORKER = Path(__file__).parent / "workers" / "pipe_precision_worker.py"


def test_bf16_pipeline_tracks_the_fp32_reference():
    for result in check(run_world(WORKER, 4, "bf16", timeout=240)):
        record = result.records()[0]
        assert record["dtype"] == "torch.bfloat16"
        # AdamW at lr 0.05 moves every weight ~0.05 a step, so bf16 rounding can flip one step's sign:
        # the weights stay within one step of fp32, the losses within 2 %
        assert record["max_abs_error"] < 0.1, record
        for loss, ref_loss in zip(record["losses"], record["reference_losses"]):
            assert abs(loss - ref_loss) < 0.02 * ref_loss, record
        assert record["skipped"] == [0, 0, 0, 0]


def test_fp16_overflow_on_one_stage_skips_the_step_everywhere():
    for result in check(run_world(WORKER, 4, "fp16", timeout=240)):
        record = result.records()[0]
        assert record["dtype"] == "torch.float16"
        assert record["skipped"] == [0, 1, 1, 1], record   # only step 2 (poisoned on rank 0 alone) is skipped
        assert record["scales"][1] == record["scales"][0] / 2, record

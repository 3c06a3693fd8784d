"""Precision, overflow skipping, optimizers, data loading and memory, checked in one 2-rank world."""
from pathlib import Path

import pytest

from tests.helpers.world import check, run_world

WORKER = Path(__file__).parent / "workers" / "features_worker.py"


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    folder = tmp_path_factory.mktemp("features")
    results = check(run_world(WORKER, 2, timeout=300, env={"FEATURES_DIR": str(folder)}))
    by_check = {}
    for result in results:
        for record in result.records():
            by_check.setdefault(record["check"], []).append(record)
    by_check["folder"] = folder
    return by_check


@pytest.mark.parametrize("stage", [1, 2])
def test_fp16_overflow_on_one_rank_skips_everywhere(records, stage):
    for record in records[f"overflow_stage{stage}"]:
        assert record["dtype"] == "torch.float16"
        assert record["skipped"] == [0, 0, 1, 1] and record["global_steps"] == 4
        assert record["unchanged"] and record["same"]
        assert record["scales"] == [256.0, 256.0, 128.0, 128.0]  # hysteresis 1: halve at once
        assert record["lrs"] == [0.0, 0.001, 0.001, 0.002]  # the scheduler did not advance on the skip
        assert record["loss_scale_config"] == 0.0  # DeepSpeed's loss_scale(): 0 means dynamic


def test_nan_loss_skips_the_step(records):
    for record in records["nan_loss"]:
        assert record["skipped"] == 1 and record["unchanged"] and not record["applied"]


@pytest.mark.parametrize("stage,model", [(1, lambda n: 4 + 12 / n), (2, lambda n: 2 + 14 / n)])
def test_memory_breakdown_follows_zero_paper(records, stage, model):
    for record in records[f"memory_stage{stage}"]:
        assert record["param_dtype"] == "torch.bfloat16" and record["master_dtype"] == "torch.float32"
        assert record["per_param"] == pytest.approx(model(2), rel=0.05)


def test_lamb_needs_the_untested_flag_and_trains(records):
    for record in records["lamb"]:
        assert record["refused"] and record["type"] == "Lamb"
        assert record["losses"][-1] < record["losses"][0]


def test_client_optimizer_and_scheduler_callables(records):
    for record in records["client_callables"]:
        assert record["same_object"] and record["same"]
        assert record["lr"] == pytest.approx(0.125)  # StepLR stepped once per optimizer step


def test_training_data_is_sharded(records):
    first, second = records["dataloader"]
    assert first["batches"] == second["batches"] == 3 and first["batch_size"] == 4
    assert sorted(first["seen"] + second["seen"]) == list(range(24))


def test_optimizer_doing_its_own_communication_gets_local_grads(records):
    assert all(record["grads_differ"] for record in records["own_communication"])


def test_progress_line_timers_and_csv_monitor(records):
    rank0, rank1 = records["monitor"]
    assert rank0["same"] and rank0["comm_dtype"] == "torch.float32"
    progress = [line for line in rank0["lines"] if line.startswith("[zero] progress ")]
    assert len(progress) == 2 and progress[0].startswith("[zero] progress step=2 loss=")
    fields = dict(token.split("=", 1) for token in progress[0].split()[2:])   # one line, key=value
    assert fields["lr"] == "1.0000e-02" and fields["skipped"] == "0" and float(fields["samples/s"]) > 0
    assert any(line.startswith("[zero] time (ms) | forward:") for line in rank0["lines"])
    assert rank1["lines"] == []  # only rank 0 prints
    csv = (records["folder"] / "job" / "Train_Samples_train_loss.csv").read_text().splitlines()
    assert csv[0] == "step,value" and [row.split(",")[0] for row in csv[1:]] == ["4", "8", "12", "16"]


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_bf16_with_fp32_accumulation(records, stage):
    for record in records[f"bf16_accum_stage{stage}"]:
        assert record["dtype"] == "torch.bfloat16" and record["steps"] == 6 and record["same"]
        assert record["last"] < 0.8 * record["first"]

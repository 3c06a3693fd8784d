"""ZeRO-1 with a pipeline in bf16 (pipe 2 x data 2, gloo): each data rank keeps only its 1/data slice
of the stage's fp32 masters, and trains exactly as stage 0 with whole masters does."""
from pathlib import Path

from tests.helpers.world import check, run_world

WORKER = Path(__file__).parent / "workers" / "pipe_precision_worker.py"


def records(zero_stage):
    found = [result.records()[0] for result in check(run_world(WORKER, 4, "bf16", str(zero_stage), timeout=240))]
    return {(r["stage"], r["data_rank"]): r for r in found}


def test_bf16_stage_1_keeps_a_slice_of_the_fp32_masters_and_matches_stage_0():
    whole, sliced = records(0), records(1)
    errors = {}
    for key, record in sliced.items():
        assert record["sharded"] and record["dtype"] == "torch.bfloat16"
        assert whole[key]["fp32_weight_numel"] == record["stage_numel"]            # stage 0: every master
        assert record["fp32_weight_numel"] == -(-record["stage_numel"] // 2), record  # stage 1: 1/data of them
        errors[key] = max(abs(a - b) for a, b in zip(record["weights"], whole[key]["weights"]))
        assert errors[key] == 0.0, (key, errors[key])
        assert record["losses"] == whole[key]["losses"]
    print("bf16 pipe 2 x data 2, stage 1 vs stage 0 weights, max abs difference per (stage, data rank):", errors,
          "fp32 weight elements stage 0 / stage 1:",
          {k: (whole[k]["fp32_weight_numel"], r["fp32_weight_numel"]) for k, r in sliced.items()})

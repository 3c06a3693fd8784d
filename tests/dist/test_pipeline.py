"""Pipeline parallelism through the real launcher (gloo, 4 ranks) against single-process AdamW.

fp32, 4 steps, gradient accumulation >= 2, clipping at 0.05 (active: every step's norm is above it).
The 5-layer model splits unevenly over 2 stages (and over 4); the tied case shares the first and
the last layer's weight across stages. Also: DeepSpeed's pipe-major rank order, the stage
``state_dict`` keys, and each stage holding exactly its partition's parameter bytes.
"""
from pathlib import Path

import pytest

from tests.helpers.world import check, run_world

WORKER = Path(__file__).parent / "workers" / "pipe_worker.py"
CLIP = 0.05


def _run(stages, schedule, model, gas, method, world_size=4, tensor=1):
    results = check(run_world(WORKER, world_size, str(stages), schedule, model, str(gas), method, str(tensor),
                              timeout=240))
    records = [result.records()[0] for result in results]
    return sorted(records, key=lambda record: record["rank"])


def _check_parity(records):
    worst = max(max(abs(a - b) for pair in zip(r["losses"], r["reference_losses"]) for a, b in zip(*pair))
                for r in records)
    print(f"parity: max abs weight error {max(r['max_abs_error'] for r in records):.3g}, "
          f"loss/norm error {worst:.3g} (tensor {records[0]['tensor']}, data {records[0]['dp']})")
    for record in records:
        assert record["max_abs_error"] < 1e-5, record
        for (loss, norm), (ref_loss, ref_norm) in zip(record["losses"], record["reference_losses"]):
            assert abs(loss - ref_loss) < 1e-5 and abs(norm - ref_norm) < 1e-5, record
            assert norm > CLIP  # clipping really acted


def _check_accessors(records, dp, tensor, gas):
    """DeepSpeed's engine accessors on a pipe 2 x data x tensor grid (DeepSpeed 0.19.8 gives the same
    world/dp/mp sizes: mp is every rank of one data replica, stages times tensor ranks)."""
    world = 2 * dp * tensor
    for record in records:
        views = record["accessors"]
        assert views == {"world_size": world, "dp_world_size": dp, "mp_world_size": 2 * tensor,
                         "global_rank": record["rank"], "local_rank": record["rank"], "device": "cpu",
                         "train_batch_size": 2 * gas * dp, "train_micro_batch_size_per_gpu": 2,
                         "gradient_accumulation_steps": gas, "global_samples": 4 * 2 * gas * dp,
                         "was_step_applied": True}, record


def _check_partition_bytes(records):
    for record in records:
        parts, stage = record["parts"], record["stage"]
        owned = record["reference_param_counts"][parts[stage]:parts[stage + 1]]
        assert record["param_bytes"] == 4 * sum(owned), record


@pytest.mark.parametrize("schedule, gas, model", [("1f1b", 2, "plain"), ("gpipe", 3, "plain"),
                                                 ("1f1b", 2, "plain+ckpt")])
def test_pipeline_2_x_data_2_matches_adamw(schedule, gas, model):
    """"plain+ckpt": activation_checkpoint_interval=2 recomputes the stage's layers in backward."""
    records = _run(2, schedule, model, gas, "parameters")
    _check_parity(records)
    _check_partition_bytes(records)
    _check_accessors(records, dp=2, tensor=1, gas=gas)
    # pipe-major: ranks 0, 1 are stage 0 (data 0, 1); ranks 2, 3 stage 1
    assert [(r["stage"], r["data_rank"]) for r in records] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert records[0]["parts"] == [0, 2, 5]    # 144 | 272 + 136: uneven layer counts
    # every layer module runs once per micro-batch; checkpointed, backward recomputes some of them
    # (non-reentrant checkpointing stops recomputing once the saved tensors it needs are back)
    per_pass = [2, 3]   # modules on stage 0 (Linear, Tanh), stage 1 (Linear, Tanh, Linear)
    for record in records:
        layers = per_pass[record["stage"]] * gas * 4
        if model.endswith("+ckpt"):
            assert layers < record["layer_forwards"] <= 2 * layers, record
        else:
            assert record["layer_forwards"] == layers, record
    assert records[0]["keys"] == ["0.bias", "0.weight"]
    assert records[2]["keys"] == ["2.bias", "2.weight", "4.bias", "4.weight"]


def test_tied_weight_across_stages_matches_adamw():
    records = _run(2, "1f1b", "tied", 2, "uniform")
    _check_parity(records)
    assert all("tied_modules.io.weight" in r["keys"] for r in records)
    assert records[0]["parts"] == [0, 3, 5]


def test_four_stages_uneven_layers_match_adamw():
    records = _run(4, "1f1b", "plain", 4, "uniform")
    _check_parity(records)
    _check_partition_bytes(records)
    assert records[0]["parts"] == [0, 2, 3, 4, 5] and records[0]["dp"] == 1


@pytest.mark.parametrize("world_size", [4, 8])
def test_pipeline_2_x_tensor_2_x_data_matches_adamw(world_size):
    """3D: 2 stages x 2 tensor ranks (x 2 data ranks at 8): three sharded MLP blocks and a head."""
    records = _run(2, "1f1b", "tp", 2, "uniform", world_size=world_size, tensor=2)
    _check_parity(records)
    _check_accessors(records, dp=world_size // 4, tensor=2, gas=2)
    # model (tensor) innermost, then data, pipe outermost
    expected = [(s, d, m) for s in range(2) for d in range(world_size // 4) for m in range(2)]
    assert [(r["stage"], r["data_rank"], r["model_rank"]) for r in records] == expected
    # bytes follow the partition [0, 2, 4] and the shards: a block holds (128 + 16 + 128) / 2 + 8 floats
    assert all(r["parts"] == [0, 2, 4] for r in records)
    assert [r["param_bytes"] for r in records] == [4 * 2 * 144] * (world_size // 2) + [4 * (144 + 72)] * (world_size // 2)


@pytest.mark.parametrize("model, gas, method, parts", [
    ("plain", 2, "uniform", [0, 2, 3, 4, 5]),     # rank 0 holds layers 0-1 and 3, rank 1 layers 2 and 4
    ("plain", 4, "parameters", [0, 2, 3, 4, 5]),   # 144 + 0 | 272 | 0 | 136
    ("tied", 2, "uniform", [0, 2, 3, 4, 5]),      # the tie joins chunk 0 of rank 0 and chunk 1 of rank 1
])
def test_interleaved_1f1b_with_two_virtual_stages_matches_adamw(model, gas, method, parts):
    records = _run(2, "interleaved:2", model, gas, method)
    _check_parity(records)
    assert all(r["parts"] == parts for r in records)
    for record in records:    # a rank holds its two non-adjacent chunks' parameters, no more
        owned = [i for chunk in (0, 1) for i in range(parts[2 * chunk + record["stage"]], parts[2 * chunk + record["stage"] + 1])]
        if model == "plain":
            assert record["param_bytes"] == 4 * sum(record["reference_param_counts"][i] for i in owned), record
            assert record["keys"] == sorted(f"{i}.{n}" for i in owned if i % 2 == 0 for n in ("bias", "weight"))


@pytest.mark.parametrize("schedule, model, gas, method", [("1f1b", "plain+zero1", 2, "parameters"),
                                                          ("gpipe", "tied+zero1", 3, "uniform")])
def test_zero_stage_1_shards_the_optimizer_over_the_data_axis_and_matches_adamw(schedule, model, gas, method):
    """Pipe 2 x data 2 at ZeRO stage 1: each data rank keeps Adam's moments for half its stage's elements."""
    records = _run(2, schedule, model, gas, method)
    _check_parity(records)
    print(f"pipe 2 x data 2, stage 1, {schedule}, {model}: max abs error "
          f"{max(r['max_abs_error'] for r in records):.3g}")
    for record in records:
        parts, stage = record["parts"], record["stage"]
        stage_numel = sum(record["reference_param_counts"][parts[stage]:parts[stage + 1]])
        assert record["optimizer_state_numel"] == 2 * -(-stage_numel // 2), record   # exp_avg + exp_avg_sq


def test_3d_at_zero_stage_1_matches_adamw():
    """Pipe 2 x tensor 2 x data 2 at stage 1: each (stage, tensor rank) splits its shards' moments over data."""
    records = _run(2, "1f1b", "tp+zero1", 2, "uniform", world_size=8, tensor=2)
    _check_parity(records)
    print(f"pipe 2 x tensor 2 x data 2, stage 1: max abs error {max(r['max_abs_error'] for r in records):.3g}")
    for record in records:    # a stage's local (sharded) floats: 2 x 144 on stage 0, 144 + 72 on stage 1
        local = record["param_bytes"] // 4
        assert record["optimizer_state_numel"] == 2 * -(-local // 2), record

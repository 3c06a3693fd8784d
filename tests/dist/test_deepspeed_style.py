"""Scripts written the way DeepSpeed's tutorials write them (issue 17's silent wrong-training bugs).

Each scenario runs in its own 2-rank world through the real launcher; ds_style_worker.py says what
each case does. The reference is single-process AdamW on the global batch (parity_worker).
"""
from pathlib import Path

import pytest

from tests.helpers.world import check, run_world

WORKER = Path(__file__).parent / "workers" / "ds_style_worker.py"


def _records(scenario):
    results = check(run_world(WORKER, 2, scenario, timeout=300))
    return results[0].records()


@pytest.fixture(scope="module")
def seeds():
    return _records("seeds")


@pytest.fixture(scope="module")
def plain():
    return _records("plain")


@pytest.fixture(scope="module")
def access():
    return {r["model"]: r for r in _records("access")}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_per_rank_seeds_train_rank_zeros_model(seeds, stage):
    (record,) = [r for r in seeds if r["stage"] == stage]
    assert record["error"] < 1e-5, record


def test_plain_backward_matches_the_reference(plain):
    cases = [r for r in plain if r["scenario"] == "plain"]
    assert {(r["stage"], r["gas"], r["offload"]) for r in cases} >= {(1, 3, False), (2, 3, False), (2, 2, True),
                                                                     (3, 3, False), (3, 2, True)}
    bad = [r for r in cases if r["error"] > 1e-5]
    assert not bad, bad


def test_plain_backward_carries_the_fp16_loss_scale(plain):
    (record,) = [r for r in plain if r["scenario"] == "plain_fp16"]
    assert record["scales"][0] == record["scales"][1]
    assert record["error"] <= 1e-6, record


def test_stage0_refuses_plain_backward_clearly(plain):
    (record,) = [r for r in plain if r["scenario"] == "stage0"]
    assert record["refused"] and record["kind"] == "PlainBackwardRefused"
    assert "stage 0" in record["message"] and "engine.backward(loss)" in record["hint"]


@pytest.mark.parametrize("model", ["mha", "encoder", "child_weight", "tied"])
def test_stage3_gathers_a_parameter_read_without_its_module(access, model):
    record = access[model]
    assert record["change"] > 1e-3                      # it trained
    assert record["loss_error"] < 1e-5 and record["param_error"] < 1e-5, record

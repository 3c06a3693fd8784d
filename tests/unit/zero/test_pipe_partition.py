"""Pipeline partitions and schedules: pure functions, checked against DeepSpeed's observed splits."""
import pytest

from launcher.zero.errors import ConfigError
from launcher.zero.pipeline.layer_split import partition_balanced, partition_layers, partition_uniform
from launcher.zero.pipeline.schedule import BACKWARD, FORWARD, build_schedule

# the reference's 8-layer model: Linear 8->64, Tanh, Linear 64->16, Tanh, Linear 16->16, Tanh, Linear 16->8, Linear 8->4
COUNTS = [576, 0, 1040, 0, 272, 0, 136, 36]
TYPES = ["Linear", "Tanh", "Linear", "Tanh", "Linear", "Tanh", "Linear", "Linear"]


@pytest.mark.parametrize("method, parts", [
    ("uniform", [0, 4, 8]),                 # DeepSpeed: [0..3] / [4..7]
    ("type:Linear", [0, 6, 8]),             # DeepSpeed: [0..5] / [6..7]
    ("type:linear", [0, 6, 8]),             # case-insensitive, as DeepSpeed
    ("parameters", [0, 2, 8]),              # 576+0 | 1484 (DeepSpeed's note says [0] | [1..7]; same balance)
])
def test_partition_methods_on_the_reference_model(method, parts):
    assert partition_layers(method, 2, COUNTS, TYPES) == parts


@pytest.mark.parametrize("items, stages, parts", [
    (5, 2, [0, 3, 5]), (7, 3, [0, 3, 5, 7]), (2, 4, [0, 1, 2, 2, 2]), (8, 4, [0, 2, 4, 6, 8])])
def test_uniform_gives_the_remainder_to_the_first_stages(items, stages, parts):
    assert partition_uniform(items, stages) == parts


def test_balanced_minimises_the_spread_and_ties_go_late():
    assert partition_balanced([1, 1, 1, 1], 2) == [0, 2, 4]
    assert partition_balanced([10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], 2) == [0, 1, 11]
    assert partition_balanced([1, 0, 1], 2) == [0, 2, 3]      # tie between [0]|[1,2] and [0,1]|[2]: later


@pytest.mark.parametrize("method, match", [("sizes", "not one of"), ("type:(", "bad regular"), ("type:Conv", "no layer")])
def test_bad_methods_are_config_errors(method, match):
    with pytest.raises(ConfigError, match=match):
        partition_layers(method, 2, COUNTS, TYPES)


@pytest.mark.parametrize("name", ["1f1b", "gpipe"])
@pytest.mark.parametrize("micro, stages", [(1, 2), (4, 2), (8, 4), (3, 4)])
def test_every_schedule_runs_each_micro_batch_forward_then_backward_once(name, micro, stages):
    for stage in range(stages):
        actions = build_schedule(name, micro, stages, stage)
        assert sorted(m for kind, m in actions if kind == FORWARD) == list(range(micro))
        assert sorted(m for kind, m in actions if kind == BACKWARD) == list(range(micro))
        for m in range(micro):
            assert actions.index((FORWARD, m)) < actions.index((BACKWARD, m))


def _peak_in_flight(actions):
    live = peak = 0
    for kind, _ in actions:
        live += 1 if kind == FORWARD else -1
        peak = max(peak, live)
    return peak


def test_1f1b_holds_at_most_stages_minus_stage_activations():
    for stage in range(4):
        assert _peak_in_flight(build_schedule("1f1b", 8, 4, stage)) == 4 - stage
        assert _peak_in_flight(build_schedule("gpipe", 8, 4, stage)) == 8
    assert build_schedule("1F1B", 4, 2, 1)[:4] == [(FORWARD, 0), (BACKWARD, 0), (FORWARD, 1), (BACKWARD, 1)]


def test_unknown_schedule_is_a_config_error():
    with pytest.raises(ConfigError, match="pipeline.schedule"):
        build_schedule("zigzag", 4, 2, 0)

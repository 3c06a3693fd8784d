"""--include/--exclude/--num_nodes/--num_gpus, against DeepSpeed 0.19.8's results."""
import pytest

from launcher.errors import FilterError
from launcher.planning.filters import apply_counts, apply_include_exclude, parse_node_specs

POOL = {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3]}


@pytest.mark.parametrize("include, exclude, expected", [
    # DeepSpeed 0.19.8 (pip) results, reference/launchers.md 1.3
    ("worker-0", None, {"worker-0": [0, 1, 2, 3]}),
    ("worker-0:0,2@worker-1", None, {"worker-0": [0, 2], "worker-1": [0, 1, 2, 3]}),
    ("worker-1:0,1", None, {"worker-1": [0, 1]}),
    (None, "worker-0", {"worker-1": [0, 1, 2, 3]}),
    (None, "worker-1:0", {"worker-0": [0, 1, 2, 3], "worker-1": [1, 2, 3]}),
    # merged, deduplicated, sorted; hostfile order kept
    ("worker-1:3@worker-0:2,1@worker-1:3,0", None, {"worker-0": [1, 2], "worker-1": [0, 3]}),
    (None, "worker-0:3,0@worker-1", {"worker-0": [1, 2]}),
    (None, None, POOL),
])
def test_include_exclude(include, exclude, expected):
    assert apply_include_exclude(POOL, include, exclude) == expected


@pytest.mark.parametrize("include, exclude, message", [
    ("worker-2", None, "host 'worker-2' is not in the hostfile"),
    ("worker-0:5", None, "host 'worker-0' has no slot 5"),
    (None, "worker-0:9", "has no slot 9"),
    ("worker-0", "worker-1", "mutually exclusive"),
    ("a:0:1", None, "bad node spec 'a:0:1'"),
    ("worker-0:", None, "slot '' of host 'worker-0' is not a whole number"),
    ("worker-0:x", None, "slot 'x'"),
    ("worker-0@", None, "empty node spec"),
    (None, "worker-0@worker-1", "leaves no slots"),
])
def test_filter_errors(include, exclude, message):
    with pytest.raises(FilterError, match=message):
        apply_include_exclude(POOL, include, exclude)


def test_parse_node_specs_merges_like_deepspeed():
    assert parse_node_specs("w0:1@w0:0,1", "-i") == {"w0": [0, 1]}
    assert parse_node_specs("h", "-i") == {"h": None}
    assert parse_node_specs("h:0,2", "-i") == {"h": [0, 2]}
    assert parse_node_specs("a,b", "-i") == {"a,b": None}  # one host named 'a,b', as in DeepSpeed


@pytest.mark.parametrize("num_nodes, num_gpus, expected", [
    (1, None, {"worker-0": [0, 1, 2, 3]}),
    (None, 2, {"worker-0": [0, 1], "worker-1": [0, 1]}),
    (2, 1, {"worker-0": [0], "worker-1": [0]}),
    (None, None, POOL),
])
def test_counts(num_nodes, num_gpus, expected):
    assert apply_counts(POOL, num_nodes, num_gpus) == expected


@pytest.mark.parametrize("num_nodes, num_gpus, message", [
    (3, None, "--num_nodes 3 asks for more nodes than the 2 available"),
    (None, 8, "--num_gpus 8 asks for more slots than some hosts have"),  # DeepSpeed silently gives 0..7
    (0, None, "--num_nodes must be >= 1"),
    (None, 0, "--num_gpus must be >= 1"),
])
def test_count_errors(num_nodes, num_gpus, message):
    with pytest.raises(FilterError, match=message):
        apply_counts(POOL, num_nodes, num_gpus)


def test_an_unknown_host_without_a_hostfile_does_not_speak_of_the_hostfile():
    with pytest.raises(FilterError) as info:
        apply_include_exclude({"localhost": [0, 1]}, "foo", None, from_hostfile=False)
    assert "without a hostfile only this machine (localhost) is used" in info.value.message
    assert "the hostfile" not in info.value.message and "-H HOSTFILE" in info.value.hint

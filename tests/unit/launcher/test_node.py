"""What a node adds to a rank's environment when it starts it."""
import pytest

from launcher.node.ranks import runtime_env, visible_devices


@pytest.mark.parametrize("slots, node_visible, expected", [
    ("0,1", None, "0,1"), ("0,1", "2,3", "2,3"), ("1", "5,7", "7"), ("0,1", "GPU-a,GPU-b", "GPU-a,GPU-b"),
    ("0,2", "4,5", "0,2"),  # more slots than the node shows: leave the plan's ids alone
])
def test_visible_devices(slots, node_visible, expected):
    assert visible_devices(slots, node_visible) == expected


def test_runtime_env_defaults_never_override_the_user():
    env = runtime_env({"RANK": "0"}, {"GLOO_SOCKET_IFNAME": "ib0", "OMP_NUM_THREADS": "7"}, 2, "eth0", 16)
    assert (env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"], env["OMP_NUM_THREADS"]) == ("ib0", "eth0", "7")
    env = runtime_env({"RANK": "0"}, {}, 4, None, 16)
    assert env["OMP_NUM_THREADS"] == "4" and "NCCL_SOCKET_IFNAME" not in env
